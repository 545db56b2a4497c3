{{/* The chart name, or nameOverride. */}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: fullnameOverride, else the release name, followed by the
chart name unless the release name already contains it. Truncated so that "<prefix>-operator"
stays a valid DNS label.
*/}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of the operator's objects. */}}
{{- define "strata.operator.fullname" -}}
{{- printf "%s-operator" (include "strata.fullname" .) }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "strata.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "strata.labels" -}}
helm.sh/chart: {{ include "strata.chart" . }}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: strata
{{- end }}

{{/* Labels of the operator's objects. */}}
{{- define "strata.operator.labels" -}}
{{ include "strata.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Selector of the operator pods; never change it, a Deployment's selector is immutable. */}}
{{- define "strata.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "strata.operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strata.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The tag of the project's images unless a component names its own: image.tag, or else the
chart's appVersion. */}}
{{- define "strata.image.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The operator image. */}}
{{- define "strata.operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "strata.image.tag" .) }}
{{- end }}

{{/* The master's image. */}}
{{- define "strata.master.image" -}}
{{- printf "%s:%s" .Values.master.image.repository (default (include "strata.image.tag" .) .Values.master.image.tag) }}
{{- end }}

{{/* The workers' image. */}}
{{- define "strata.worker.image" -}}
{{- printf "%s:%s" .Values.worker.image.repository (default (include "strata.image.tag" .) .Values.worker.image.tag) }}
{{- end }}

{{/* The workers' ServiceAccount; the operator names it in every worker DaemonSet. */}}
{{- define "strata.worker.serviceAccountName" -}}
strata-worker
{{- end }}

{{/* The CSI node plugin's image. */}}
{{- define "strata.csi.image" -}}
{{- printf "%s:%s" .Values.csi.image.repository (default (include "strata.image.tag" .) .Values.csi.image.tag) }}
{{- end }}

{{/* Selector of the CSI node plugin pods; never change it, a DaemonSet's selector is immutable. */}}
{{- define "strata.csiNode.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: csi-node
{{- end }}
