{{- /* The node daemon's DaemonSet: `tessera-node` (the device plugin) or, with "dra",
       `tessera-node-dra` (DRA: --dra, no device plugin) on the pools of
       nodeDaemon.dra.nodeLabels. Its argument: (dict "root" $ "dra" bool). */}}
{{- define "tessera.nodeDaemon.daemonSet" }}
{{- $root := .root }}
{{- $dra := .dra }}
{{- $nd := $root.Values.nodeDaemon }}
{{- $sim := eq $nd.deviceVisibility "sim" }}
{{- /* sim: the simulated driver's files are mounted into GPU containers by their host
       path (as the NVIDIA toolkit would), so the daemon sees them at the same path */}}
{{- $driverMount := ternary $nd.driverRoot "/driver-root" $sim }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ ternary "tessera-node-dra" "tessera-node" $dra }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "tessera.labels" $root | nindent 4 }}
    app.kubernetes.io/component: node-daemon
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: tessera
      app.kubernetes.io/component: node-daemon
      {{- if $dra }}
      tessera.dev/node-daemon: dra
      {{- end }}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 1}
  template:
    metadata:
      labels:
        {{- include "tessera.labels" $root | nindent 8 }}
        app.kubernetes.io/component: node-daemon
        {{- if $dra }}
        tessera.dev/node-daemon: dra
        {{- end }}
    spec:
      serviceAccountName: {{ $nd.serviceAccount.name }}
      {{- include "tessera.pullSecrets" $root | nindent 6 }}
      priorityClassName: {{ $nd.priorityClassName }}
      hostPID: true
      {{- with include "tessera.nodeDaemon.terms" (dict "nd" $nd "dra" $dra) | fromYamlArray }}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              {{- toYaml . | nindent 14 }}
      {{- end }}
      {{- with $nd.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: daemon
          image: {{ include "tessera.nodeImage" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            - run
            - --driver-root={{ $driverMount }}
            - --state-dir={{ $nd.stateDir }}
            - --device-plugin-dir={{ $nd.kubeletDir }}/device-plugins
            - --pod-resources-socket={{ $nd.kubeletDir }}/pod-resources/kubelet.sock
            - --libtessera=/opt/tessera/lib/libtessera.so
            - --device-plugin={{ and $nd.devicePlugin.enabled (not $dra) }}
            {{- if $dra }}
            - --dra=true
            - --kubelet-root={{ $nd.kubeletDir }}
            - --cdi-dir={{ $nd.dra.cdiDir }}
            {{- end }}
            - --device-visibility={{ $nd.deviceVisibility }}
            - --shares-per-unit={{ $nd.devicePlugin.sharesPerGPU }}
            - --share-policy={{ $nd.devicePlugin.sharePolicy }}
            - --metrics-port={{ $nd.metricsPort }}
            {{- range $nd.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: NODE_NAME
              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
            {{- if $sim }}
            # the daemon's --sim-node and the simulator's libnvidia-ml both read it
            - name: TESSERA_SIM_NODE
              value: {{ required "nodeDaemon.simNode is required with deviceVisibility sim" $nd.simNode | quote }}
            {{- end }}
            {{- with $nd.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - {name: metrics, containerPort: {{ $nd.metricsPort }}, protocol: TCP}
          startupProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 10
            failureThreshold: 3
          readinessProbe:
            httpGet: {path: /readyz, port: metrics}
            periodSeconds: 2
            failureThreshold: 3
          resources:
            {{- toYaml $nd.resources | nindent 12 }}
          securityContext:
            privileged: true
            readOnlyRootFilesystem: true
          volumeMounts:
            - {name: driver-root, mountPath: {{ $driverMount }}, readOnly: {{ not $sim }}}
            - {name: state, mountPath: {{ $nd.stateDir }}}
            - {name: device-plugins, mountPath: {{ $nd.kubeletDir }}/device-plugins}
            - {name: pod-resources, mountPath: {{ $nd.kubeletDir }}/pod-resources}
            {{- if $dra }}
            # the kubelet plugin's sockets: registration, and the DRA service the kubelet dials
            - {name: plugins-registry, mountPath: {{ $nd.kubeletDir }}/plugins_registry}
            - {name: plugins, mountPath: {{ $nd.kubeletDir }}/plugins}
            # each prepared claim's CDI spec, which the container runtime applies
            - {name: cdi, mountPath: {{ $nd.dra.cdiDir }}}
            {{- end }}
            - {name: tmp, mountPath: /tmp}
      volumes:
        - name: driver-root
          hostPath: {path: {{ $nd.driverRoot }}, type: Directory}
        - name: state
          hostPath: {path: {{ $nd.stateDir }}, type: DirectoryOrCreate}
        - name: device-plugins
          hostPath: {path: {{ $nd.kubeletDir }}/device-plugins, type: DirectoryOrCreate}
        - name: pod-resources
          hostPath: {path: {{ $nd.kubeletDir }}/pod-resources, type: DirectoryOrCreate}
        {{- if $dra }}
        - name: plugins-registry
          hostPath: {path: {{ $nd.kubeletDir }}/plugins_registry, type: DirectoryOrCreate}
        - name: plugins
          hostPath: {path: {{ $nd.kubeletDir }}/plugins, type: DirectoryOrCreate}
        - name: cdi
          hostPath: {path: {{ $nd.dra.cdiDir }}, type: DirectoryOrCreate}
        {{- end }}
        - name: tmp
          emptyDir: {medium: Memory, sizeLimit: 16Mi}
{{- end }}

{{- /* The DaemonSet's node affinity terms (a YAML list; empty: every node). Without DRA
       pools: nodeDaemon.gpuNodeSelectorTerms. With them, each GPU term ANDed with the pool's
       labels (the DRA DaemonSet) or with NOT the pool's labels (the device plugin's): for
       labels {a: x, b: y} that is one term per label, a NotIn [x] or b NotIn [y], since
       terms are ORed. A node is in exactly one of the two: never both, never none. */}}
{{- define "tessera.nodeDaemon.terms" }}
{{- $nd := .nd }}
{{- $pool := $nd.dra.nodeLabels }}
{{- $gpu := $nd.gpuNodeSelectorTerms | default (list (dict)) }}
{{- $out := list }}
{{- if not $pool }}
{{- $out = $nd.gpuNodeSelectorTerms | default list }}
{{- else if .dra }}
{{- range $gpu }}
{{- $exprs := .matchExpressions | default list }}
{{- range $k, $v := $pool }}
{{- $exprs = append $exprs (dict "key" $k "operator" "In" "values" (list $v)) }}
{{- end }}
{{- $out = append $out (set (deepCopy .) "matchExpressions" $exprs) }}
{{- end }}
{{- else }}
{{- range $gpu }}
{{- $term := . }}
{{- range $k, $v := $pool }}
{{- $exprs := append ($term.matchExpressions | default list) (dict "key" $k "operator" "NotIn" "values" (list $v)) }}
{{- $out = append $out (set (deepCopy $term) "matchExpressions" $exprs) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
