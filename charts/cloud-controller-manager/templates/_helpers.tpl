{{/*
Names shared by the templates. Every object is named after the release, so two releases
(e.g. in two namespaces) never collide on a cluster-scoped ClusterRole or ClusterRoleBinding.
*/}}

{{/* The chart's name: nameOverride, else cloud-controller-manager (max 63). */}}
{{- define "ccm.name" -}}
{{- .Values.nameOverride | default "cloud-controller-manager" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
fullnameOverride, else <release>-<name>, or the release name if it already contains the name
(max 63). Default: <release>-cloud-controller-manager.
*/}}
{{- define "ccm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ccm.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The manager's ServiceAccount: serviceAccount.name, else the fullname. */}}
{{- define "ccm.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "ccm.fullname" .) -}}
{{- end -}}

{{- define "ccm.labels" -}}
{{ include "ccm.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
commonAnnotations as an `annotations:` block at metadata level (two spaces), with a leading
newline; nothing when empty. Used right after each object's labels line.
*/}}
{{- define "ccm.annotations" -}}
{{- with .Values.commonAnnotations }}
  annotations: {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{- define "ccm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccm.name" . }}
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
{{/*
The manager's --cloud-provider name: upstream's (gce for gcp, as cloud-provider-gcp's
manifests and providers/gcp/src/lib.rs PROVIDER_NAME), else the provider.
*/}}
{{- define "ccm.cloudProviderFlag" -}}
{{- $p := include "ccm.provider" . -}}
{{- if eq $p "gcp" -}}gce{{- else -}}{{ $p }}{{- end -}}
{{- end -}}

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
{{- $c := .Values.cloudConfig -}}
{{- if gt (len (compact (list $c.secretName $c.configMapName $c.content))) 1 -}}
{{- fail "cloudConfig: set one of secretName, configMapName or content, not several" -}}
{{- end -}}
{{- if or $c.secretName $c.configMapName $c.content -}}true{{- end -}}
{{- end -}}

{{/* The Secret the chart renders from cloudConfig.content (templates/cloud-config.yaml). */}}
{{- define "ccm.cloudConfigSecretName" -}}
{{- printf "%s-cloud-config" (include "ccm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Whether the probes use the plain-HTTP health endpoint on the node's loopback
(--healthz-bind-address=127.0.0.1:<probes.healthzPort>): with hostNetwork (the pod's loopback is
the node's, which only the node reaches) and a non-zero probes.healthzPort.
*/}}
{{- define "ccm.healthzOnLoopback" -}}
{{- if and .Values.hostNetwork (gt (int .Values.probes.healthzPort) 0) -}}true{{- end -}}
{{- end -}}

{{/*
The manager's flags (upstream names), each one list item, quoted. The chart's own flags come
first; values.args are appended (a later flag overrides an earlier one).
*/}}
{{- define "ccm.args" -}}
- {{ printf "--cloud-provider=%s" (include "ccm.cloudProviderFlag" .) | quote }}
- {{ printf "--v=%d" (int .Values.logVerbosity) | quote }}
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
{{- if .Values.useServiceAccountCredentials }}
- {{ printf "--controller-service-account-prefix=%s" (include "ccm.controllerAccountPrefix" .) | quote }}
{{- end }}
- {{ printf "--secure-port=%d" (int .Values.securePort) | quote }}
{{- if eq (include "ccm.healthzOnLoopback" .) "true" }}
- {{ printf "--healthz-bind-address=127.0.0.1:%d" (int .Values.probes.healthzPort) | quote }}
{{- end }}
{{- if eq (include "ccm.hasCloudConfig" .) "true" }}
- {{ printf "--cloud-config=%s/%s" (include "ccm.cloudConfigDir" .) .Values.cloudConfig.key | quote }}
{{- else if and (eq (include "ccm.provider" .) "azure") .Values.cloudCredentialSecret.name }}
{{- /* Azure without a config file reads its config from this Secret (providers/azure/src/config.rs
read_secret): the flags name the very Secret the credential Role allows. */}}
- {{ printf "--cloud-config-secret-name=%s" .Values.cloudCredentialSecret.name | quote }}
- {{ printf "--cloud-config-secret-namespace=%s" .Values.cloudCredentialSecret.namespace | quote }}
{{- end }}
{{- range .Values.args }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Who the manager's own roles are bound to: the chart's ServiceAccount (in-cluster config) and,
only when rbac.bindCloudControllerManagerUser asks for it, the user kubeadm-style static
manifests run the CCM as (a client certificate for system:cloud-controller-manager). Any
client certificate with that common name then holds these roles: off by default.
*/}}
{{- define "ccm.subjects" -}}
- kind: ServiceAccount
  name: {{ include "ccm.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- if .Values.rbac.bindCloudControllerManagerUser }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:cloud-controller-manager
{{- end }}
{{- end -}}

{{/*
The client names of ccm_core::controllers::all() (core/src/controllers/mod.rs, `client_name`):
each controller's calls are made with the client of its client name. core/tests/it/rbac.rs
checks this list against the code.
*/}}
{{- define "ccm.clientNames" -}}
["node-controller", "route-controller", "service-controller"]
{{- end -}}

{{/*
"true" when AWS's tagging controller runs (providers/aws/src/tagging.rs: disabled by default,
so only a "tagging" entry in controllers enables it; a later "-tagging" disables it again),
else "". It calls with the client of its own client name, tagging-controller.
*/}}
{{- define "ccm.awsTagging" -}}
{{- $on := false -}}
{{- if eq .Values.provider "aws" -}}
{{- range .Values.controllers -}}
{{- if eq . "tagging" -}}{{- $on = true -}}{{- end -}}
{{- if eq . "-tagging" -}}{{- $on = false -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/*
kube-controller-manager's own controller ServiceAccounts in kube-system: the apiserver's
bootstrap policy binds each to its system:controller:<name> ClusterRole (node-controller may
delete any Pod and update any Pod's status, and so on), plus the names upstream's
cloud-controller-manager addon manifests bind (cloud-node-controller, pvl-controller, ...). The
chart never creates, binds or mints a token for one of these; core/tests/it/rbac.rs checks on a
real apiserver that no binding but the chart's names the chart's per-controller accounts.
*/}}
{{- define "ccm.kubeControllerManagerAccounts" -}}
["attachdetach-controller", "certificate-controller", "clusterrole-aggregation-controller", "cronjob-controller", "daemon-set-controller", "deployment-controller", "disruption-controller", "endpoint-controller", "endpointslice-controller", "endpointslicemirroring-controller", "ephemeral-volume-controller", "expand-controller", "generic-garbage-collector", "horizontal-pod-autoscaler", "job-controller", "legacy-service-account-token-cleaner", "namespace-controller", "node-controller", "persistent-volume-binder", "pod-garbage-collector", "pv-protection-controller", "pvc-protection-controller", "replicaset-controller", "replication-controller", "resourcequota-controller", "root-ca-cert-publisher", "route-controller", "selinux-warning-controller", "service-account-controller", "service-cidrs-controller", "service-controller", "statefulset-controller", "ttl-after-finished-controller", "ttl-controller", "validatingadmissionpolicy-status-controller", "volumeattributesclass-protection-controller", "cloud-node-controller", "cloud-node-lifecycle-controller", "node-ipam-controller", "pvl-controller"]
{{- end -}}

{{/*
The prefix of the CCM's own per-controller ServiceAccounts (useServiceAccountCredentials):
controllerServiceAccounts.prefix, default "<fullname>-". Never empty: an empty prefix would
name kube-controller-manager's accounts.
*/}}
{{- define "ccm.controllerAccountPrefix" -}}
{{- .Values.controllerServiceAccounts.prefix | default (printf "%s-" (include "ccm.fullname" .)) -}}
{{- end -}}

{{/*
The per-controller ServiceAccount of a client name (the argument list: root context, client
name): <prefix><client name>, in kube-system. Fails when that is one of kube-controller-manager's
accounts or longer than a ServiceAccount name may be.
*/}}
{{- define "ccm.controllerAccount" -}}
{{- $root := index . 0 -}}
{{- $name := printf "%s%s" (include "ccm.controllerAccountPrefix" $root) (index . 1) -}}
{{- if has $name (include "ccm.kubeControllerManagerAccounts" $root | fromJsonArray) -}}
{{- fail (printf "controllerServiceAccounts.prefix makes the per-controller account %q, one of kube-controller-manager's accounts (bootstrap roles system:controller:*): choose another prefix" $name) -}}
{{- end -}}
{{- if gt (len $name) 253 -}}
{{- fail (printf "per-controller ServiceAccount name %q is longer than 253 characters" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* Every per-controller ServiceAccount name, as a JSON list (resourceNames). */}}
{{- define "ccm.controllerAccounts" -}}
{{- $names := list -}}
{{- range (include "ccm.clientNames" . | fromJsonArray) -}}
{{- $names = append $names (include "ccm.controllerAccount" (list $ .)) -}}
{{- end -}}
{{- if include "ccm.awsTagging" . -}}
{{- $names = append $names (include "ccm.controllerAccount" (list $ "tagging-controller")) -}}
{{- end -}}
{{- $names | toJson -}}
{{- end -}}

{{/*
Who a controller's roles are bound to (the argument list: root context, client name): its own
ServiceAccount with useServiceAccountCredentials, else the manager's own identity (every
controller then calls with the manager's credentials).
*/}}
{{- define "ccm.controllerSubjects" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.useServiceAccountCredentials -}}
- kind: ServiceAccount
  name: {{ include "ccm.controllerAccount" (list $root (index . 1)) }}
  namespace: kube-system
{{- else -}}
{{- include "ccm.subjects" $root -}}
{{- end -}}
{{- end -}}
