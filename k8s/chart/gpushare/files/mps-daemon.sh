set -eu
nvidia-cuda-mps-control -f &
daemon=$!
trap 'echo quit | nvidia-cuda-mps-control; wait "$daemon"; exit 0' TERM INT
until echo get_default_active_thread_percentage | nvidia-cuda-mps-control >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || exit 1
  sleep 0.2
done
echo "set_default_active_thread_percentage $((100 / GPUSHARE_SHARES))" | nvidia-cuda-mps-control
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
echo "set_default_device_pinned_mem_limit 0 $((memory / GPUSHARE_SHARES))M" | nvidia-cuda-mps-control
wait "$daemon"
