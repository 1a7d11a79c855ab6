{{/* Names, labels and small derived values shared by every template. */}}

{{- define "modelpool-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelpool-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "modelpool-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelpool-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelpool-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "modelpool-operator.labels" -}}
helm.sh/chart: {{ include "modelpool-operator.chart" . }}
{{ include "modelpool-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelpool
{{- end }}

{{- define "modelpool-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "modelpool-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "modelpool-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The repository of the workers' default image (config.serverImage, else the operator's built-in
ghcr.io/modelpool/modelpool-server:<version>: modelpool_contract.flags.DEFAULT_SERVER_IMAGE) without its tag
or digest, as policy.image_repository cuts it: the images a pool may name when config.allowedImages is
empty. */}}
{{- define "modelpool-operator.serverImageRepository" -}}
{{- $image := .Values.config.serverImage | default "ghcr.io/modelpool/modelpool-server" }}
{{- regexReplaceAll ":[^:/]*$" (regexReplaceAll "@.*$" $image "") "" }}
{{- end }}

{{/* The namespaces a namespace-scoped operator watches: scope.namespaces, or the release namespace. */}}
{{/* The namespaces the operator watches outside cluster scope: scope.namespaces, which must be listed.
Pools are never served from the release namespace (the operator refuses them, the gateway never routes
them), so it is no default: an empty list would be an install that serves nothing. (Listing the release
namespace among others is harmless, its pools are refused, and the NOTES say so.) */}}
{{- define "modelpool-operator.watchNamespaces" -}}
{{- if not .Values.scope.namespaces }}
{{- fail (printf "scope.namespaces: list the namespaces whose pools the operator serves (scope.clusterWide=false); not %s, the release namespace, where pools are refused" .Release.Namespace) }}
{{- end }}
{{- join "," .Values.scope.namespaces }}
{{- end }}

{{/* config.<camelCase> -> MODELPOOL_OPERATOR_<SNAKE_CASE> env vars (empty strings and lists are left out, so
the operator's own default applies; a list is comma-separated). */}}
{{- define "modelpool-operator.configEnv" -}}
{{- range $key, $value := .Values.config }}
{{- if kindIs "slice" $value }}
{{- if $value }}
- name: MODELPOOL_OPERATOR_{{ $key | snakecase | upper }}
  value: {{ join "," $value | quote }}
{{- end }}
{{- else if not (and (kindIs "string" $value) (eq $value "")) }}
- name: MODELPOOL_OPERATOR_{{ $key | snakecase | upper }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's settings for the NetworkPolicy it gives each pool (networkPolicy.*): whom it admits, named
by pod labels in the release namespace, and the callers listed in the values, as JSON. */}}
{{- define "modelpool-operator.networkPolicyEnv" -}}
{{- if .Values.inferencePool.enabled }}
- name: MODELPOOL_OPERATOR_INFERENCE_POOLS_ENABLED
  value: "true"
{{- end }}
{{- if .Values.networkPolicy.enabled }}
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_ENABLED
  value: "true"
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_OPERATOR_LABELS
  value: {{ include "modelpool-operator.selectorLabels" . | fromYaml | toJson | quote }}
{{- if and .Values.gateway.enabled .Values.networkPolicy.admitGateway }}
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_GATEWAY_LABELS
  value: {{ include "modelpool-operator.gatewaySelectorLabels" . | fromYaml | toJson | quote }}
{{- end }}
{{- with .Values.networkPolicy.from }}
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_FROM
  value: {{ toJson . | quote }}
{{- end }}
{{- with .Values.networkPolicy.metricsFrom }}
- name: MODELPOOL_OPERATOR_NETWORK_POLICY_METRICS_FROM
  value: {{ toJson . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway's names: its own app.kubernetes.io/name, so neither Deployment's selector matches the other's
pods. */}}
{{- define "modelpool-operator.gatewayFullname" -}}
{{- printf "%s-gateway" (include "modelpool-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelpool-operator.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-gateway" (include "modelpool-operator.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "modelpool-operator.gatewayLabels" -}}
helm.sh/chart: {{ include "modelpool-operator.chart" . }}
{{ include "modelpool-operator.gatewaySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelpool
app.kubernetes.io/component: gateway
{{- end }}

{{- define "modelpool-operator.gatewayServiceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "modelpool-operator.gatewayFullname" .) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespaces the gateway routes to, comma-separated; empty: every namespace. gateway.namespaces, else
the operator's scope. */}}
{{- define "modelpool-operator.gatewayNamespaces" -}}
{{- if .Values.gateway.namespaces }}
{{- join "," .Values.gateway.namespaces }}
{{- else if not .Values.scope.clusterWide }}
{{- include "modelpool-operator.watchNamespaces" . }}
{{- end }}
{{- end }}

{{/* The namespace of the gateway's admin keys: gateway.auth.keysNamespace, else <release namespace>-keys
(modelpool_contract.gateway_keys.default_keys_namespace). Never the release namespace: the gateway lists every
Secret of the namespace its keys live in (RBAC cannot select by label), and the release namespace holds the
operator's control seed and Helm's release Secrets. */}}
{{- define "modelpool-operator.gatewayKeysNamespace" -}}
{{- $ns := default (printf "%s-keys" .Release.Namespace) .Values.gateway.auth.keysNamespace }}
{{- if eq $ns .Release.Namespace }}
{{- fail (printf "gateway.auth.keysNamespace: %s is the release namespace, whose Secrets (the operator's control seed, Helm's releases) the gateway must not list; name a namespace of their own (empty: %s-keys)" $ns .Release.Namespace) }}
{{- end }}
{{- if gt (len $ns) 63 }}
{{- fail (printf "gateway.auth.keysNamespace: %s is longer than a namespace name's 63 characters; set gateway.auth.keysNamespace" $ns) }}
{{- end }}
{{- $ns }}
{{- end }}

{{/*
The leader election Lease's name (leaderElection.leaseName, else the full name); fails on settings that
cannot fence a leader or on standbys that nothing keeps from acting.
*/}}
{{- define "modelpool-operator.leaseName" -}}
{{- $le := .Values.leaderElection }}
{{- if and (gt (int .Values.replicaCount) 1) (not $le.enabled) (not .Values.peering.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: several replicas would all act on the budget at once" }}
{{- end }}
{{- if $le.enabled }}
{{- if not (lt (float64 $le.renewDeadlineSeconds) (float64 $le.leaseDurationSeconds)) }}
{{- fail "leaderElection.renewDeadlineSeconds must be shorter than leaderElection.leaseDurationSeconds (a leader stops acting before its Lease can be taken)" }}
{{- end }}
{{- if not (lt (float64 $le.retryPeriodSeconds) (float64 $le.renewDeadlineSeconds)) }}
{{- fail "leaderElection.retryPeriodSeconds must be shorter than leaderElection.renewDeadlineSeconds" }}
{{- end }}
{{- end }}
{{- $le.leaseName | default (include "modelpool-operator.fullname" .) }}
{{- end }}
