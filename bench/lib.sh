# Sourced by bench/with-*.sh (`. bench/lib.sh NAME`): a temp dir of its own ($tmp,
# /tmp/brownout-NAME.XXXXXX), the PIDs it starts ($pids: each stopped, then waited for, and the
# temp dir removed on any exit), and port(), a spare loopback port.
tmp=$(mktemp -d "/tmp/brownout-$1.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
