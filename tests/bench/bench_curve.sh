#!/bin/bash
# 4 workers, one 16M-element e4m3 tensor, 10 steps, with and without CURVE.
B=$(cd "$(dirname "$0")/../.." && pwd)/build
rm -f /tmp/cb_*; $B/worker/apsctl keygen /tmp/cb_srv >/dev/null; $B/worker/apsctl keygen /tmp/cb_w >/dev/null
sed -n 2p /tmp/cb_w.pub > /tmp/cb_allow
for mode in plain curve plain curve; do
  port=$((5700 + RANDOM % 200))
  X=""
  if [ $mode = curve ]; then
    X="--curve_secret_key_file /tmp/cb_srv.key --curve_allow_file /tmp/cb_allow"
    export APS_CURVE_SERVER_KEY=$(sed -n 2p /tmp/cb_srv.pub) APS_CURVE_PUBLIC_KEY=$(sed -n 2p /tmp/cb_w.pub) APS_CURVE_SECRET_KEY=$(sed -n 2p /tmp/cb_w.key)
  fi
  $B/server/apsd --listen tcp://127.0.0.1:$port $X --stats /tmp/cb.sock 2>/dev/null & D=$!
  sleep 0.3
  start=$(date +%s.%N); pids=""
  for r in 0 1 2 3; do $B/tests/integration/itest_worker --endpoint tcp://127.0.0.1:$port --rank $r --world 4 --sizes 16000000 --steps 10 --unchecked 1 >/dev/null & pids="$pids $!"; done
  wait $pids
  end=$(date +%s.%N)
  kill $D; wait $D 2>/dev/null
  echo "$mode: $(echo "($end - $start)/10" | bc -l | cut -c1-5) s per step (4 workers, 16M e4m3 elements, loopback)"
  unset APS_CURVE_SERVER_KEY APS_CURVE_PUBLIC_KEY APS_CURVE_SECRET_KEY
done
