{{/* Labels every object carries; `component` names the part. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "tessera.tag" -}}
{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "tessera.operatorImage" -}}
{{ .Values.image.repository }}/tessera-operator:{{ include "tessera.tag" . }}
{{- end }}

{{- define "tessera.nodeImage" -}}
{{ .Values.image.repository }}/tessera-node:{{ include "tessera.tag" . }}
{{- end }}

{{- define "tessera.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* With cert-manager, its CA injector sets the webhooks' caBundle from this Certificate. */}}
{{- define "tessera.webhookAnnotations" -}}
{{- if .Values.webhook.certificate.certManager }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/tessera-webhook
{{- end }}
{{- end }}
