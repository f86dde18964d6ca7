{{/* The image of every container: repository and tag, the tag defaulting to the chart's appVersion. */}}
{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels on every object's metadata (a component label is added by each template). */}}
{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* Selector labels (pods); the component label is added by each template. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pod security context shared by every Sluice pod. */}}
{{- define "sluice.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The container security context shared by every Sluice container. */}}
{{- define "sluice.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* The cert-manager issuer of every Certificate the chart renders (tls.certManager.enabled). */}}
{{- define "sluice.issuerRef" -}}
name: {{ required "tls.certManager.issuerRef.name: the Issuer or ClusterIssuer that signs Sluice's certificates" .Values.tls.certManager.issuerRef.name }}
kind: {{ .Values.tls.certManager.issuerRef.kind }}
group: {{ .Values.tls.certManager.issuerRef.group }}
{{- end }}

{{/* The private key of every Certificate: ECDSA P-256, as `sluice dispatcher certs` makes; a new one at each renewal. */}}
{{- define "sluice.privateKey" -}}
algorithm: ECDSA
size: 256
rotationPolicy: Always
{{- end }}
