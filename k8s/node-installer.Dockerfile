# gpushare node installer: copies gpushare-runtime onto the node, writes its configuration
# and the containerd drop-in, creates the node signing key (k8s/node-install.sh).
#   docker build -f k8s/node-installer.Dockerfile -t gpushare/node-installer:0.1.0 .
# The runtime runs on the node's own python3 (3.11 to 3.13); a create that copies devices from
# another pod asks the kubelet (gRPC), so grpcio and protobuf are prepared here for each of those
# versions and the installer copies the one the node needs (versions as in uv.lock).
FROM python:3.11-slim AS site
ARG TARGETARCH=amd64
RUN set -eu; case "$TARGETARCH" in arm64) arch=aarch64 ;; *) arch=x86_64 ;; esac; \
    for version in 3.11 3.12 3.13; do \
      pip install --no-cache-dir --quiet --target "/site/$version" --only-binary=:all: \
        --implementation cp --python-version "$version" --platform "manylinux_2_17_$arch" \
        grpcio==1.85.3 protobuf==7.36.2; \
    done

FROM debian:bookworm-slim
COPY runtime /opt/gpushare/runtime
COPY libs/common/gpushare_common /opt/gpushare/libs/common/gpushare_common
COPY --from=site /site /opt/gpushare/site
COPY k8s/node-install.sh /opt/gpushare/k8s/node-install.sh
ENTRYPOINT ["/opt/gpushare/k8s/node-install.sh"]
