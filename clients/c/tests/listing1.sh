#!/bin/sh
# Runs build/listing1 against the fake santad of test_client (which answers
# no requests itself, and says rule n has 10n hits): the ready line,
# answers from the application over IPv4 and IPv6, the stats reply, exit 0 on
# SIGTERM, and a clear failure when santad is not there.
# usage: tests/listing1.sh BUILD_DIR   ($VALGRIND, if set, wraps listing1)
set -eu
B=$1
VALGRIND=${VALGRIND:-}
dir=$(mktemp -d)
fake=
app=
cleanup() {
	[ -n "$app" ] && kill "$app" 2>/dev/null || true
	[ -n "$fake" ] && kill "$fake" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "listing1.sh: FAIL: $*" >&2; exit 1; }

"$B/test_client" --serve "$dir/santa.sock" &
fake=$!
for _ in $(seq 50); do [ -S "$dir/santa.sock" ] && break; sleep 0.1; done

# santad missing: non-zero exit and a message naming the socket
if "$B/listing1" --socket "$dir/missing.sock" 127.0.0.1 0 >/dev/null 2>"$dir/err"; then
	fail "listing1 succeeded without santad"
fi
grep -q "connect to santad at $dir/missing.sock" "$dir/err" || fail "unclear error: $(cat "$dir/err")"

# pick a free port (a race with other programs is harmless here)
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("::", 0)); print(s.getsockname()[1])')

for addr in 127.0.0.1 ::1; do
	mkfifo "$dir/out"
	$VALGRIND "$B/listing1" --socket "$dir/santa.sock" "$addr" "$port" >"$dir/out" &
	app=$!
	read -r ready <"$dir/out" || fail "no ready line"
	rm "$dir/out"
	echo "$ready" | grep -Eq '^ready cookie=[1-9][0-9]* rule=[1-9][0-9]*$' || fail "ready line: $ready"
	rule=${ready##*rule=}
	python3 - "$addr" "$port" "$rule" <<'PY' || fail "UDP exchange with listing1 on $addr"
import socket, sys
addr, port, rule = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
for req, want in ((b"Hello", b"app:Hello"), (b"stats", b"hits=%d" % (10 * rule)), (b"", b"app:"), (b"x" * 2000, b"app:" + b"x" * 2000)):
    s.sendto(req, (addr, port))
    got = s.recv(65536)
    if got != want:
        sys.exit("sent %r, got %r, want %r" % (req[:20], got[:40], want[:40]))
PY
	kill -TERM "$app"
	wait "$app" || fail "listing1 on $addr exited $? on SIGTERM"
	app=
	echo "listing1 on $addr: ok ($ready)"
done
