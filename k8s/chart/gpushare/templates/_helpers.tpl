{{/* An image of this repository: <registry>/gpushare/<name>:<tag>. */}}
{{- define "gpushare.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- with $root.Values.images.registry }}{{ trimSuffix "/" . }}/{{ end -}}
gpushare/{{ $name }}:{{ $root.Values.images.tag | default $root.Chart.AppVersion }}
{{- end -}}

{{/* The labels every object of a part carries; the selector uses the name only. */}}
{{- define "gpushare.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: gpushare
{{- end -}}

{{/* The namespace ShadowPods live in. */}}
{{- define "gpushare.shadowNamespace" -}}
{{ .Values.shadow.namespace | default .Release.Namespace }}
{{- end -}}

{{/* The username of a gpushare service account in admission requests. */}}
{{- define "gpushare.serviceAccountUser" -}}
{{- $root := index . 0 -}}
system:serviceaccount:{{ $root.Release.Namespace }}:gpushare-{{ index . 1 }}
{{- end -}}

{{/* The Secret with the passwords of the two static NATS users (auth, installer) and the routes. */}}
{{- define "gpushare.natsSecret" -}}
{{ .Values.nats.auth.existingSecret | default "nats-users" }}
{{- end -}}

{{/* The Secret with the auth callout's issuer secret (key "issuer"). */}}
{{- define "gpushare.natsIssuerSecret" -}}
{{ .Values.nats.auth.existingIssuerSecret | default "nats-auth-issuer" }}
{{- end -}}

{{/* Host names of the in-chart NATS servers (the StatefulSet's pods through the headless Service). */}}
{{- define "gpushare.natsHosts" -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.nats.replicas) -}}
{{- $hosts = append $hosts (printf "gpushare-nats-%d.gpushare-nats-headless.%s.svc.%s" $i $.Release.Namespace $.Values.clusterDomain) -}}
{{- end -}}
{{ join "," $hosts }}
{{- end -}}

{{/* GPUSHARE_NATS_URL: every server, comma-separated. */}}
{{- define "gpushare.natsUrls" -}}
{{- if .Values.nats.enabled -}}
{{- $urls := list -}}
{{- range $host := splitList "," (include "gpushare.natsHosts" .) -}}
{{- $urls = append $urls (printf "nats://%s:4222" $host) -}}
{{- end -}}
{{ join "," $urls }}
{{- else -}}
{{- if not .Values.nats.external.urls -}}
{{- fail "nats.enabled=false needs nats.external.urls (every server of the external NATS)" -}}
{{- end -}}
{{ join "," .Values.nats.external.urls }}
{{- end -}}
{{- end -}}

{{/* GPUSHARE_NATS_STREAM_REPLICAS. */}}
{{- define "gpushare.streamReplicas" -}}
{{- if gt (int .Values.nats.streamReplicas) 0 -}}
{{ int .Values.nats.streamReplicas }}
{{- else if .Values.nats.enabled -}}
{{ min (int .Values.nats.replicas) 3 }}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* nats-leaf://<server>:7422 of every server of the cluster: where each node's leaf connects. */}}
{{- define "gpushare.natsLeafUrls" -}}
{{- if .Values.nats.enabled -}}
{{- $urls := list -}}
{{- range $host := splitList "," (include "gpushare.natsHosts" .) -}}
{{- $urls = append $urls (printf "nats-leaf://%s:7422" $host) -}}
{{- end -}}
{{ join "," $urls }}
{{- else -}}
{{- if not .Values.nats.external.leafUrls -}}
{{- fail "nats.enabled=false needs nats.external.leafUrls (the leafnode port of every server of the external NATS)" -}}
{{- end -}}
{{ join "," .Values.nats.external.leafUrls }}
{{- end -}}
{{- end -}}

{{/* The environment every node service gets: node, its node's leaf server and its user there,
     logging, port. Arguments: root, HTTP port, NATS role. */}}
{{- define "gpushare.serviceEnv" -}}
{{- $root := index . 0 -}}
- name: GPUSHARE_NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: NODE_IP  # the node's address, where its leaf server listens (no setting: GPUSHARE_NATS_URL uses it)
  valueFrom: {fieldRef: {fieldPath: status.hostIP}}
- {name: GPUSHARE_NATS_URL, value: "nats://$(NODE_IP):{{ int $root.Values.natsLeaf.port }}"}
- {name: GPUSHARE_NATS_USER, value: {{ index . 2 | quote }}}
- {name: GPUSHARE_NATS_PASSWORD_FILE, value: /var/run/secrets/gpushare/nats/password}
- {name: GPUSHARE_NATS_STREAM_REPLICAS, value: "1"}
- {name: GPUSHARE_LOG_JSON, value: {{ $root.Values.logJson | quote }}}
- {name: GPUSHARE_HTTP_PORT, value: {{ index . 1 | quote }}}
{{- end -}}

{{/* The mount of a node service's password on its node's leaf (GPUSHARE_NATS_PASSWORD_FILE). */}}
{{- define "gpushare.natsPasswordMount" -}}
- {name: nats-password, mountPath: /var/run/secrets/gpushare/nats/password, readOnly: true}
{{- end -}}

{{/* That one file of the leaf's state on the node (gpushare-nats-conf leaf-users made it, root
     only): a service reads its own role's password, no other. The kubelet mounts it once the
     leaf's pod made it. Arguments: root, NATS role. */}}
{{- define "gpushare.natsPasswordVolume" -}}
- name: nats-password
  hostPath: {path: {{ (index . 0).Values.natsLeaf.stateDir }}/users/{{ index . 1 }}, type: File}
{{- end -}}

{{/* The mount of the NATS token (GPUSHARE_NATS_TOKEN_FILE): the console's, the leaf's. */}}
{{- define "gpushare.natsTokenMount" -}}
- {name: nats-token, mountPath: /var/run/secrets/gpushare/nats, readOnly: true}
{{- end -}}

{{/* The pod's projected service-account token for NATS: audience gpushare-nats, short-lived;
     the kubelet rotates it, its reader re-reads it (the console at every connect, the leaf's
     agent every 10 s), and the auth callout's TokenReview names the pod's node. */}}
{{- define "gpushare.natsTokenVolume" -}}
- name: nats-token
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ .Values.nats.auth.audience }}
          expirationSeconds: {{ int .Values.nats.auth.tokenExpirationSeconds }}
          path: token
{{- end -}}

{{/* Pod-level settings every node DaemonSet shares. */}}
{{- define "gpushare.nodePod" -}}
priorityClassName: system-node-critical
nodeSelector: {{- toYaml .Values.nodeSelector | nindent 2 }}
tolerations: [{operator: Exists}]
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The HTTP probes of a service on its named port "http". */}}
{{- define "gpushare.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
{{- end -}}

{{/* The probes of a host-network pod listening on 127.0.0.1: the kubelet probes it from the
     node's own network namespace, where that address is the pod's. */}}
{{- define "gpushare.localProbes" -}}
livenessProbe:
  httpGet: {host: 127.0.0.1, path: /healthz, port: http}
  periodSeconds: 10
readinessProbe:
  httpGet: {host: 127.0.0.1, path: /readyz, port: http}
  periodSeconds: 5
{{- end -}}

{{/* The vendor's resource names, comma-separated. */}}
{{- define "gpushare.vendorResources" -}}
{{- $names := list -}}
{{- range .Values.vendor.resources }}{{ $names = append $names .name }}{{ end -}}
{{ join "," $names }}
{{- end -}}

{{/* GPUSHARE_DP_VENDOR_SOCKETS: resource=socket,... */}}
{{- define "gpushare.vendorSockets" -}}
{{- $pairs := list -}}
{{- range .Values.vendor.resources }}{{ $pairs = append $pairs (printf "%s=%s" .name .socket) }}{{ end -}}
{{ join "," $pairs }}
{{- end -}}

{{/* nodeSelector as the shadow-controller's key=value,... setting. */}}
{{- define "gpushare.selectorSetting" -}}
{{- $pairs := list -}}
{{- range $key, $value := .Values.nodeSelector }}{{ $pairs = append $pairs (printf "%s=%s" $key $value) }}{{ end -}}
{{ join "," $pairs }}
{{- end -}}

{{/* A file of the chart as the body of a literal block scalar (4 spaces; blank lines stay empty). */}}
{{- define "gpushare.fileBlock" -}}
{{ regexReplaceAll "(?m)^(.+)$" ((index . 0).Files.Get (index . 1)) "    ${1}" }}
{{- end -}}

{{/* A map as a key=value,... setting (keys sorted). */}}
{{- define "gpushare.pairs" -}}
{{- $pairs := list -}}
{{- range $key, $value := . }}{{ $pairs = append $pairs (printf "%s=%v" $key $value) }}{{ end -}}
{{ join "," $pairs }}
{{- end -}}

{{/* "true" when the DeviceClasses serve gpushare's extended resources (dra.extendedResources:
auto = the cluster serves DRAExtendedResource and partitionable devices by default: Kubernetes
>= 1.36 with resource.k8s.io/v1). */}}
{{- define "gpushare.draExtended" -}}
{{- $want := toString .Values.dra.extendedResources -}}
{{- if eq $want "auto" -}}
{{- and (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (semverCompare ">=1.36-0" .Capabilities.KubeVersion.Version) -}}
{{- else -}}
{{- eq $want "true" -}}
{{- end -}}
{{- end -}}
