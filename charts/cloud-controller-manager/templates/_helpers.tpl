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
{{ include "ccm.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | quote }}
{{- end -}}

{{- define "ccm.selectorLabels" -}}
app.kubernetes.io/name: cloud-controller-manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The cloud: values.provider, one of the clouds this chart has a preset for. */}}
{{- define "ccm.provider" -}}
{{- $p := .Values.provider | required "provider is required: install with -f values-<cloud>.yaml" -}}
{{- if not (has $p (list "aws" "azure" "gcp" "openstack" "vsphere" "ibm")) -}}
{{- fail (printf "provider %q is not one of aws, azure, gcp, openstack, vsphere, ibm" $p) -}}
{{- end -}}
{{- $p -}}
{{- end -}}

{{/*
The cloud's image: <registry>/<repository>[:tag][@digest]; the repository defaults to
cloud-controller-manager-<provider> (one image per cloud, built by ci/image or cmd/Dockerfile).
*/}}
{{- define "ccm.image" -}}
{{- $repo := .Values.image.repository | default (printf "cloud-controller-manager-%s" (include "ccm.provider" .)) -}}
{{- $ref := $repo -}}
{{- if .Values.image.registry -}}
{{- $ref = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repo -}}
{{- end -}}
{{- $ref = printf "%s:%s" $ref (.Values.image.tag | default .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}
{{- $ref = printf "%s@%s" $ref .Values.image.digest -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* Where the cloud config is mounted and the --cloud-config path. */}}
{{- define "ccm.cloudConfigDir" -}}/etc/kubernetes/cloud-config{{- end -}}
{{- define "ccm.hasCloudConfig" -}}
{{- if and .Values.cloudConfig.secretName .Values.cloudConfig.configMapName -}}
{{- fail "cloudConfig: set secretName or configMapName, not both" -}}
{{- end -}}
{{- if or .Values.cloudConfig.secretName .Values.cloudConfig.configMapName -}}true{{- end -}}
{{- end -}}

{{/*
The manager's flags (upstream names), each one list item, quoted. The chart's own flags come
first; values.args are appended (a later flag overrides an earlier one).
*/}}
{{- define "ccm.args" -}}
- {{ printf "--cloud-provider=%s" (include "ccm.provider" .) | quote }}
- {{ printf "--cluster-name=%s" .Values.clusterName | quote }}
- {{ printf "--controllers=%s" (join "," .Values.controllers) | quote }}
- {{ printf "--leader-elect=%t" .Values.leaderElect | quote }}
{{- if .Values.leaderElect }}
- {{ printf "--leader-elect-resource-namespace=%s" .Values.leaderElectResourceNamespace | quote }}
- {{ printf "--leader-elect-resource-name=%s" .Values.leaderElectResourceName | quote }}
{{- end }}
- {{ printf "--configure-cloud-routes=%t" .Values.configureCloudRoutes | quote }}
{{- if .Values.clusterCIDR }}
- {{ printf "--cluster-cidr=%s" .Values.clusterCIDR | quote }}
{{- end }}
- {{ printf "--use-service-account-credentials=%t" .Values.useServiceAccountCredentials | quote }}
- {{ printf "--secure-port=%d" (int .Values.securePort) | quote }}
{{- if eq (include "ccm.hasCloudConfig" .) "true" }}
- {{ printf "--cloud-config=%s/%s" (include "ccm.cloudConfigDir" .) .Values.cloudConfig.key | quote }}
{{- end }}
{{- range .Values.args }}
- {{ . | quote }}
{{- end }}
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
