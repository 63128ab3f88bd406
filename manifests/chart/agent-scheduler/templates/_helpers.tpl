{{/* Base name of every object of the release. */}}
{{- define "as.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "as.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "as.selector" (list . "worker") */}}
{{- define "as.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "as.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "as.policyNamespace" -}}
{{ .Values.sharding.namespace | default .Release.Namespace }}
{{- end -}}

{{- define "as.dispatchSecret" -}}
{{ .Values.dispatchSecret.name | default (printf "%s-dispatch" (include "as.fullname" .)) }}
{{- end -}}

{{- define "as.etcdName" -}}
{{ include "as.fullname" . }}-etcd
{{- end -}}

{{/* host:port of every etcd member, comma-separated: what --etcd-endpoints gets. */}}
{{- define "as.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $name := include "as.etcdName" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s-%d.%s-headless.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.etcd.clientPort)) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else -}}
{{- required "etcd.external.endpoints is required when etcd.enabled is false" .Values.etcd.external.endpoints -}}
{{- end -}}
{{- end -}}

{{/* Secret holding ca.crt, tls.crt and tls.key of the scheduler's etcd client certificate. */}}
{{- define "as.etcdClientSecret" -}}
{{- if .Values.etcd.enabled -}}
{{ include "as.etcdName" . }}-client-tls
{{- else -}}
{{ required "etcd.external.tlsSecret is required for an external etcd with etcd.tls.enabled" .Values.etcd.external.tlsSecret }}
{{- end -}}
{{- end -}}

{{- define "as.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
  periodSeconds: 5
  failureThreshold: {{ div .Values.probes.startupSeconds 5 }}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
  periodSeconds: {{ .Values.probes.periodSeconds }}
  failureThreshold: {{ .Values.probes.failureThreshold }}
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
  periodSeconds: {{ .Values.probes.periodSeconds }}
  failureThreshold: {{ .Values.probes.failureThreshold }}
{{- end -}}

{{/* Environment, volume mounts and volumes every scheduler container shares. */}}
{{- define "as.commonEnv" -}}
- {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
- {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
- {name: AGENT_SCHEDULER_ETCD, value: {{ include "as.etcdEndpoints" . | quote }}}
- {name: AGENT_SCHEDULER_DISPATCH_SECRET_FILE, value: /etc/agent-scheduler/dispatch/secret}
- {name: AGENT_SCHEDULER_METRICS_AUTH, value: {{ .Values.metrics.auth | quote }}}
- {name: PYTHONDONTWRITEBYTECODE, value: "1"}
{{- end -}}

{{- define "as.commonArgs" -}}
- --log-format={{ .Values.logFormat }}
- --log-level={{ .Values.logLevel }}
{{- end -}}

{{- define "as.etcdArgs" -}}
- --etcd-endpoints=$(AGENT_SCHEDULER_ETCD)
- --etcd-prefix={{ .Values.etcd.prefix }}
{{- if .Values.etcd.tls.enabled }}
- --etcd-cafile=/etc/agent-scheduler/etcd/ca.crt
- --etcd-certfile=/etc/agent-scheduler/etcd/tls.crt
- --etcd-keyfile=/etc/agent-scheduler/etcd/tls.key
{{- end }}
{{- end -}}

{{- define "as.mounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: config, mountPath: /etc/agent-scheduler/config, readOnly: true}
- {name: dispatch-secret, mountPath: /etc/agent-scheduler/dispatch, readOnly: true}
{{- if .Values.etcd.tls.enabled }}
- {name: etcd-client-tls, mountPath: /etc/agent-scheduler/etcd, readOnly: true}
{{- end }}
{{- end -}}

{{- define "as.volumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
- name: config
  configMap: {name: {{ include "as.fullname" . }}-config}
- name: dispatch-secret
  secret: {secretName: {{ include "as.dispatchSecret" . }}}
{{- if .Values.etcd.tls.enabled }}
- name: etcd-client-tls
  secret: {secretName: {{ include "as.etcdClientSecret" . }}}
{{- end }}
{{- end -}}

{{/* Pod anti-affinity across nodes for one component: include "as.antiAffinity" (list . "coordinator" "preferred") */}}
{{- define "as.antiAffinity" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
podAntiAffinity:
{{- if eq (index . 2) "required" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "as.selector" (list $root $component) | nindent 10 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "as.selector" (list $root $component) | nindent 12 }}
{{- end }}
{{- end -}}

{{/* Rules to check /metrics callers with the API server (common/metricsauth.py). */}}
{{- define "as.metricsAuthRules" -}}
{{- if eq .Values.metrics.auth "delegated" }}
  # /metrics callers checked with the API server (common/metricsauth.py)
  - apiGroups: ["authentication.k8s.io"]
    resources: ["tokenreviews"]
    verbs: ["create"]
  - apiGroups: ["authorization.k8s.io"]
    resources: ["subjectaccessreviews"]
    verbs: ["create"]
{{- end }}
{{- end -}}

{{/* Non-empty when the worker applies default topology spread constraints (it then watches the Services and
controllers they are built from): anything but defaultingType List with no defaultConstraints. */}}
{{- define "as.spreadDefaults" -}}
{{- $s := .Values.worker.podTopologySpread | default dict -}}
{{- if not (and (eq ($s.defaultingType | default "System") "List") (empty $s.defaultConstraints)) -}}
on
{{- end -}}
{{- end -}}
