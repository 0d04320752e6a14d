"""The configuration: CLP's ``clp-config.yaml`` models (``clp``), the coordinator's own
``coordinator:`` section and the loader (``loader``), and where objects are read (``locations``).
"""
