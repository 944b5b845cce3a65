#!/usr/bin/env bash
# Install what Santa's build, tests, demo and benchmarks need on Debian 12.
#
# Run as root. Idempotent: when everything is already in place it makes no
# network access, calls no apt, prints nothing and exits 0 in well under a
# second. It prints only on change, on a dropped package, or on failure.
#
# Toolchain contract (see README.md and Makefile): BPF C is compiled by
# clang-16 and stripped by llvm-strip-16. The Makefile exports
# BPF2GO_CC=clang-16 and BPF2GO_STRIP=llvm-strip-16 for `go generate`; this
# script also makes plain `clang` resolve (a /usr/local/bin symlink to clang-16,
# only if no clang is on PATH) so a bare `go generate ./...` works too.
set -euo pipefail

# Debian packages, by name. gnuplot-nox is the headless gnuplot (the
# `gnuplot` metapackage pulls in Qt); make and git are needed before anything
# else here can run on a fresh machine.
PACKAGES=(
	clang-16 llvm-16 libbpf-dev bpftool
	iproute2 ethtool tcpdump xdp-tools
	dnsutils knot-dnsutils nsd
	# the other authoritative servers the DNS controller must work with, and
	# a query generator: knotd (knot), named (bind9), dnsperf; bind9-utils
	# signs the DNSSEC test zone (dnssec-keygen, dnssec-signzone)
	knot bind9 bind9-utils dnsperf
	# the memcached integration: the server (its -U UDP port is what gets
	# offloaded), memcslap/memcstat and the Python client for the tests
	memcached libmemcached-tools python3-pymemcache
	python3-dnspython python3-pip
	python3-cbor2 python3-pytest python3-setuptools python3-wheel python3-venv
	valgrind gnuplot-nox
	make git
	# clients/c (libsanta): CBOR codec; json-c and pkg-config for its build and tests
	libcbor-dev libjson-c-dev pkg-config
	# the TCP/HTTP offload: the web server the tests start in the server
	# namespace (plain nginx: on Debian 12 nginx-light is only nginx plus
	# the echo module), an HTTP load generator, curl for fetches and a
	# headless browser (chromium --headless=new) for the browser test;
	# python-requests, whose pooled connections must survive eBPF's idle close
	nginx wrk curl chromium python3 python3-requests
)

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
[[ -r /etc/debian_version ]] || die "not a Debian system"

export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg (unattended-upgrades, another shell) instead
# of failing at once.
APT_OPTS=(-q -o DPkg::Lock::Timeout=600)

installed() {
	[[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null) == "ii"* ]]
}

# satisfied: the package is installed, or (gnuplot) some gnuplot variant is.
satisfied() {
	case $1 in
	gnuplot-nox) installed gnuplot-nox || command -v gnuplot >/dev/null ;;
	*) installed "$1" ;;
	esac
}

# has_candidate: apt knows an installable version of the package.
has_candidate() {
	local c
	c=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
	[[ -n $c && $c != "(none)" ]]
}

missing=()
for p in "${PACKAGES[@]}"; do
	satisfied "$p" || missing+=("$p")
done

if ((${#missing[@]})); then
	# apt-get update at most once, and only if a missing package is unknown
	# to the current lists (a fresh image often ships with no lists at all).
	for p in "${missing[@]}"; do
		if ! has_candidate "$p"; then
			log "apt-get update"
			out=$(apt-get "${APT_OPTS[@]}" update 2>&1) || { printf '%s\n' "$out" >&2; die "apt-get update failed"; }
			break
		fi
	done

	want=()
	for p in "${missing[@]}"; do
		if has_candidate "$p"; then
			want+=("$p")
		else
			log "warning: package '$p' does not exist in the configured apt sources; skipping it"
		fi
	done

	if ((${#want[@]})); then
		log "installing: ${want[*]}"
		out=$(apt-get "${APT_OPTS[@]}" install -y --no-install-recommends "${want[@]}" 2>&1) ||
			{ printf '%s\n' "$out" >&2; die "apt-get install failed"; }

		# Debian starts the DNS servers, memcached and nginx it installs.
		# Tests start their own inside network namespaces; stop and disable
		# the services of the packages installed just now, so they do not
		# hold port 53, 11211 or 80 on the host (a server that was there
		# before is left alone).
		if [[ -d /run/systemd/system ]]; then
			services=()
			for p in "${want[@]}"; do
				case $p in
				nsd) services+=(nsd) ;;
				knot) services+=(knot) ;;
				bind9) services+=(named) ;;
				memcached) services+=(memcached) ;;
				nginx) services+=(nginx) ;;
				esac
			done
			if ((${#services[@]})); then
				systemctl disable --now --quiet "${services[@]}" 2>/dev/null ||
					die "could not stop/disable the services ${services[*]}"
				log "stopped and disabled the newly installed services: ${services[*]}"
			fi
		fi
	fi
fi

# clang / llvm-strip must resolve by their plain names as well.
link_tool() { # link_tool NAME TARGET
	command -v "$1" >/dev/null && return 0
	local target
	target=$(command -v "$2") || die "$2 not found after install"
	ln -sf "$target" "/usr/local/bin/$1"
	log "linked /usr/local/bin/$1 -> $target"
}
link_tool clang clang-16
link_tool llvm-strip llvm-strip-16

# Debian starts nsd after install. Tests start their own nsd inside network
# namespaces; the system one must neither hold port 53 nor restart on upgrade.
if installed nsd; then
	if [[ -d /run/systemd/system ]]; then
		# Booted with systemd.
		if systemctl is-enabled --quiet nsd 2>/dev/null || systemctl is-active --quiet nsd 2>/dev/null; then
			systemctl disable --now --quiet nsd 2>/dev/null ||
				die "could not stop/disable the nsd service"
			log "stopped and disabled the system nsd service"
		fi
	else
		# No systemd running (container): disable offline, stop via init script.
		if command -v systemctl >/dev/null && systemctl is-enabled --quiet nsd 2>/dev/null; then
			systemctl disable --quiet nsd 2>/dev/null || true
			log "disabled the system nsd service"
		fi
		if compgen -G '/etc/rc[2-5].d/S*nsd' >/dev/null; then
			update-rc.d nsd disable >/dev/null 2>&1 || true
		fi
		if [[ -x /etc/init.d/nsd ]] && /etc/init.d/nsd status >/dev/null 2>&1; then
			/etc/init.d/nsd stop >/dev/null 2>&1 || true
			log "stopped the system nsd service"
		fi
	fi
fi

# Go is not packaged by Debian 12 in the version go.mod needs; it is expected
# at /usr/local/go (the Makefile adds that to PATH). Newer toolchains are then
# fetched by Go itself (GOTOOLCHAIN=auto) through the Go module proxy.
if ! command -v go >/dev/null && [[ ! -x /usr/local/go/bin/go ]]; then
	die "no Go toolchain found (need Go >= 1.21 on PATH or in /usr/local/go; go.mod pins the exact version)"
fi
