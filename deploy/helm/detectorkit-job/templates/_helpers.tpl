{{/* The live service's name: its ConfigMap, Secret and KEDA authentication are named after it. */}}
{{- define "dk.service" -}}
{{- .Values.service | default .Release.Name -}}
{{- end }}

{{/* This release's objects and pods: the service's, or its shadow's beside it. */}}
{{- define "dk.name" -}}
{{- include "dk.service" . }}{{ if .Values.shadow }}-shadow{{ end -}}
{{- end }}

{{- define "dk.group" -}}
{{- .Values.consumerGroup | default (include "dk.service" .) -}}
{{- end }}

{{- define "dk.streaming" -}}
{{- if ne .Values.role "aggregator" }}true{{ end -}}
{{- end }}

{{- define "dk.credentials" -}}
{{- .Values.kafka.credentialsSecret | default (printf "%s-kafka-credentials" (include "dk.service" .)) -}}
{{- end }}

{{- define "dk.selector" -}}
app.kubernetes.io/name: {{ include "dk.name" . }}
{{- end }}

{{- define "dk.labels" -}}
{{ include "dk.selector" . }}
app.kubernetes.io/part-of: diamond
app.kubernetes.io/component: {{ .Values.role }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- with .Values.team }}
team: {{ . }}
{{- end }}
{{- end }}

{{/* With Strimzi, how the user authenticates: mutual TLS, or SCRAM over TLS. */}}
{{- define "dk.scram" -}}
{{- if and .Values.kafka.strimziCluster (eq .Values.kafka.strimziAuthentication "scram-sha-512") }}true{{ end -}}
{{- end }}
{{- define "dk.mtls" -}}
{{- if and .Values.kafka.strimziCluster (eq .Values.kafka.strimziAuthentication "tls") }}true{{ end -}}
{{- end }}
