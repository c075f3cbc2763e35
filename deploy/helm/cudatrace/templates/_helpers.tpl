{{/* The chart's name. */}}
{{- define "cudatrace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release's, with the chart's unless it already holds it. */}}
{{- define "cudatrace.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "cudatrace.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "cudatrace.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* What selects the DaemonSet's pods. */}}
{{- define "cudatrace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cudatrace.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "cudatrace.labels" -}}
{{ include "cudatrace.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The service account's name. */}}
{{- define "cudatrace.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cudatrace.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* One TOML value: strings, numbers, booleans and lists of them as JSON writes them (valid TOML). */}}
{{- define "cudatrace.tomlValue" -}}
{{- toJson . }}
{{- end }}

{{/* The config file: scalar keys first, then each map as a [table]. */}}
{{- define "cudatrace.config" -}}
listen = {{ printf "0.0.0.0:%d" (int .Values.metricsPort) | quote }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ include "cudatrace.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := .Values.config }}
{{- if and (kindIs "map" $value) (ne $key "kubernetes") }}
[{{ $key }}]
{{- range $k, $v := $value }}
{{ $k }} = {{ include "cudatrace.tomlValue" $v }}
{{- end }}
{{- end }}
{{- end }}
[kubernetes]
pod_names = {{ .Values.podNames.enabled }}
refresh_s = {{ int .Values.podNames.refreshSeconds }}
{{- end }}
