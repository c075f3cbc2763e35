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

{{/* The config file: scalar keys first, then each map as a [table] (see cudatrace.tomlTable). */}}
{{- define "cudatrace.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.stateDir }}
{{- /* The incident archive in the state directory, unless config.alerts names one. */}}
{{- $alerts := default dict $config.alerts }}
{{- if not (hasKey $alerts "archive") }}
{{- $_ := set $alerts "archive" (printf "%s/incidents.jsonl" (trimSuffix "/" .Values.stateDir)) }}
{{- end }}
{{- $_ := set $config "alerts" $alerts }}
{{- /* Baselines kept across restarts in the state directory, unless config.state names one. */}}
{{- $state := default dict $config.state }}
{{- if not (hasKey $state "dir") }}
{{- $_ := set $state "dir" (trimSuffix "/" .Values.stateDir) }}
{{- end }}
{{- $_ := set $config "state" $state }}
{{- end -}}
listen = {{ printf "0.0.0.0:%d" (int .Values.metricsPort) | quote }}
{{- range $key, $value := $config }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ include "cudatrace.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $config }}
{{- if and (kindIs "map" $value) (ne $key "kubernetes") }}
{{ include "cudatrace.tomlTable" (dict "name" $key "table" $value) }}
{{- end }}
{{- end }}
[kubernetes]
pod_names = {{ .Values.podNames.enabled }}
refresh_s = {{ int .Values.podNames.refreshSeconds }}
{{- end }}

{{/* Whether a value is a list of maps: an array of tables ([[name]]). */}}
{{- define "cudatrace.isTables" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) (kindIs "map" (first .)) }}true{{ end }}
{{- end }}

{{/* One [name] table: its plain keys, then its sub-tables ([name.key]) and arrays of tables
     ([[name.key]], e.g. detect.schedule and alerts.quiet). */}}
{{- define "cudatrace.tomlTable" -}}
[{{ .name }}]
{{- range $k, $v := .table }}
{{- if not (or (kindIs "map" $v) (include "cudatrace.isTables" $v)) }}
{{ $k }} = {{ include "cudatrace.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := .table }}
{{- if kindIs "map" $v }}
{{ include "cudatrace.tomlTable" (dict "name" (printf "%s.%s" $.name $k) "table" $v) }}
{{- else if include "cudatrace.isTables" $v }}
{{- range $entry := $v }}
[[{{ $.name }}.{{ $k }}]]
{{- range $ek, $ev := $entry }}
{{ $ek }} = {{ include "cudatrace.tomlValue" $ev }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret with the metrics server's web config: the one named, else the chart's own
     (webConfig.generate), else none (plain HTTP). */}}
{{- define "cudatrace.webSecret" -}}
{{- if .Values.webConfig.secretName }}
{{- .Values.webConfig.secretName }}
{{- else if .Values.webConfig.generate }}
{{- printf "%s-web" (include "cudatrace.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret Prometheus scrapes with (username, password, ca.crt), when the chart made them. */}}
{{- define "cudatrace.scrapeSecret" -}}
{{- if and (not .Values.webConfig.secretName) .Values.webConfig.generate }}
{{- printf "%s-scrape" (include "cudatrace.fullname" .) }}
{{- end }}
{{- end }}

{{/* The name the chart's certificate is for (Prometheus checks it as serverName). */}}
{{- define "cudatrace.serverName" -}}
{{- printf "%s.%s.svc" (include "cudatrace.fullname" .) .Release.Namespace }}
{{- end }}

{{/* What an Operator monitor's endpoint adds to scrape the chart's own TLS and basic auth. */}}
{{- define "cudatrace.scrapeAuth" -}}
{{- with include "cudatrace.scrapeSecret" . }}
scheme: https
tlsConfig:
  serverName: {{ include "cudatrace.serverName" $ }}
  ca:
    secret:
      name: {{ . }}
      key: ca.crt
basicAuth:
  username:
    name: {{ . }}
    key: username
  password:
    name: {{ . }}
    key: password
{{- end }}
{{- end }}
