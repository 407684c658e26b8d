# gpushare sim (API emulator, node simulator, kernel module stand-in) for the compose
# profile "sim" — build from the repository root:
#   docker build -f compose/sim.Dockerfile -t gpushare/sim:0.1.0 .
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY libs/common libs/common
COPY sim sim
COPY compose/image-install.sh compose/image-install.sh
RUN compose/image-install.sh sim /opt/gpushare
# the simulated workloads' program, where the node simulator looks for it (beside the package)
RUN make -C sim/tools && tools=$(/opt/gpushare/bin/python -c \
      "import gpushare_sim, pathlib; print(pathlib.Path(gpushare_sim.__file__).parents[1] / 'tools')") \
    && install -D -m 0755 sim/tools/gpuload "$tools/gpuload"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="gpushare-sim" org.opencontainers.image.version="0.1.0"
COPY --from=build /opt/gpushare /opt/gpushare
ENV PATH=/opt/gpushare/bin:$PATH PYTHONUNBUFFERED=1
CMD ["python", "-m", "gpushare_sim.run", "--help"]
