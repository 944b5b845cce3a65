module github.com/santa-offload/santa

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/gopacket/gopacket v1.7.7
	github.com/miekg/dns v1.1.73
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.47.0
)

require golang.org/x/net v0.57.0 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
