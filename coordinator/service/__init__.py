"""The coordinator service: the loop that drives every ``s3_object_metadata`` job through the
lifecycle by reacting to Spider's outcomes (``coordinator.service.coordinator``), and what it needs
around it (runtime assembly, resource group, clean-up, logs).
"""
