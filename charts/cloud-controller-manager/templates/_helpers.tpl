{{/*
Names shared by the templates. Every object is named after the release, so two releases
(e.g. in two namespaces) never collide on a cluster-scoped ClusterRole or ClusterRoleBinding.
*/}}

{{/* <release>-cloud-controller-manager, or the release name if it already says so (max 63). */}}
{{- define "ccm.fullname" -}}
{{- if contains "cloud-controller-manager" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-cloud-controller-manager" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ccm.labels" -}}
app.kubernetes.io/name: cloud-controller-manager
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
Who the chart's roles are bound to: the chart's ServiceAccount (in-cluster config) and the
user kubeadm-style static manifests run the CCM as (a client certificate for
system:cloud-controller-manager).
*/}}
{{- define "ccm.subjects" -}}
- kind: ServiceAccount
  name: {{ include "ccm.fullname" . }}
  namespace: {{ .Release.Namespace }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:cloud-controller-manager
{{- end -}}

{{/*
The per-controller ServiceAccounts of --use-service-account-credentials: every distinct
`client_name` of ccm_core::controllers::all() (core/src/controllers/mod.rs), always in
kube-system (core/src/manager/credentials.rs). core/tests/it/rbac.rs checks this list against
the code.
*/}}
{{- define "ccm.controllerAccounts" -}}
["node-controller", "route-controller", "service-controller"]
{{- end -}}
