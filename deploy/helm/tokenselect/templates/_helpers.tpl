{{/* Names and labels shared by every template. */}}

{{- define "tokenselect.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-tokenselect, or <release> when the release name already contains the chart name. */}}
{{- define "tokenselect.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tokenselect.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokenselect.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tokenselect.labels" -}}
{{ include "tokenselect.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tokenselect.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Comma-separated gRPC addresses of one worker role's pods through its headless Service:
     <sts>-<i>.<svc>.<namespace>.svc:<port>. Argument: (list $ "prefill"|"decode"). */}}
{{- define "tokenselect.workerAddresses" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $name := printf "%s-%s" (include "tokenselect.fullname" $root) $role -}}
{{- $addresses := list -}}
{{- range $i := until (int (index $root.Values $role).replicas) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc:%d" $name $i $name $root.Release.Namespace (int $root.Values.ports.grpc)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/* Checks the schema cannot express. */}}
{{- define "tokenselect.validate" -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName" -}}
{{- end -}}
{{- if eq (int .Values.decode.replicas) 0 -}}
{{- fail "decode.replicas must be at least 1" -}}
{{- end -}}
{{- if eq (int .Values.prefill.replicas) 0 -}}
{{- fail "prefill.replicas must be at least 1" -}}
{{- end -}}
{{- end -}}

{{/* The model volume of every pod. */}}
{{- define "tokenselect.modelVolume" -}}
- name: model
{{- if eq .Values.model.volume.type "hostPath" }}
  hostPath:
    path: {{ .Values.model.volume.hostPath }}
    type: Directory
{{- else }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.volume.claimName }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* The probe handler of every container: gRPC health on the gRPC port, or /healthz on the
     metrics port when TLS is on (kubelet's gRPC probe cannot present a client certificate). */}}
{{- define "tokenselect.probe" -}}
{{- if .Values.tls.enabled -}}
httpGet:
  path: /healthz
  port: {{ .Values.ports.metrics }}
{{- else -}}
grpc:
  port: {{ .Values.ports.grpc }}
{{- end -}}
{{- end -}}

{{/* The TLS secret's volume and mount (nothing when TLS is off). */}}
{{- define "tokenselect.tlsVolume" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end -}}
{{- end -}}

{{- define "tokenselect.tlsMount" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  mountPath: /etc/tokenselect/tls
  readOnly: true
{{- end -}}
{{- end -}}

{{/* Scheduling settings shared by every pod. */}}
{{- define "tokenselect.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
