{{/*
The `coordinator:` section of clp-config.yaml: the Python coordinator's own settings
(.Values.clpConfig.coordinator), which CLP's other components ignore. Nothing when it is empty.
templates/configmap.yaml includes it beside the `compression_coordinator:` section, indented as
that section is:

  {{- include "clp.coordinatorConfigSection" . | nindent 4 }}

@return {string} YAML-formatted `coordinator:` section, or nothing
*/}}
{{- define "clp.coordinatorConfigSection" -}}
{{- with .Values.clpConfig.coordinator }}
coordinator:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The Python coordinator's image reference.

@return {string} repository:tag
*/}}
{{- define "clp.compressionCoordinator.imageRef" -}}
{{- $image := .Values.image.compressionCoordinator -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- end }}

{{/*
The Python coordinator's metrics port (clpConfig.coordinator.metrics_port), or nothing.

@return {string} The port, or an empty string
*/}}
{{- define "clp.compressionCoordinator.metricsPort" -}}
{{- dig "coordinator" "metrics_port" "" .Values.clpConfig -}}
{{- end }}
