# gpushare node installer: copies gpushare-runtime onto the node, writes its configuration
# and the containerd drop-in, creates the node signing key (k8s/node-install.sh).
#   docker build -f k8s/node-installer.Dockerfile -t gpushare/node-installer:0.1.0 .
FROM debian:bookworm-slim
COPY runtime /opt/gpushare/runtime
COPY libs/common/gpushare_common/__init__.py libs/common/gpushare_common/ids.py /opt/gpushare/libs/common/gpushare_common/
COPY k8s/node-install.sh /opt/gpushare/k8s/node-install.sh
ENTRYPOINT ["/opt/gpushare/k8s/node-install.sh"]
