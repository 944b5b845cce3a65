package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/santa-offload/santa/internal/testbed"
)

// emitLayouts records the layout of struct santa_tcp_emit (bpf/santa.h)
// each magic stands for. During an upgrade the TC program of one version
// runs beside the XDP program of another for moments; the magic is how TC
// tells metadata it can read from metadata it must drop.
var emitLayouts = map[uint32]string{
	santaTCPEmitMagic: "magic@0:4 seq@4:4 ack@8:4 tsecr@12:4 stamp@16:4 opts@20:4 uid@24:4 from@28:2 req_off@30:2 req_len@32:2 resend@34:1 pad@35:5 rule@40:24",
}

// TestEmitLayoutHasItsMagic fails when struct santa_tcp_emit changed
// without a new SANTA_TCP_EMIT_MAGIC: give the new layout a magic of its
// own (bpf/santa.h, santaTCPEmitMagic) and record it here.
func TestEmitLayoutHasItsMagic(t *testing.T) {
	spec, err := loadHandover() // the struct TC reads (XDP writes it from the same header)
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.Types.TypeByName("santa_tcp_emit", &st); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, m := range st.Members {
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatal(err)
		}
		fields = append(fields, fmt.Sprintf("%s@%d:%d", m.Name, m.Offset.Bytes(), size))
	}
	layout := strings.Join(fields, " ")
	if want := emitLayouts[santaTCPEmitMagic]; layout != want {
		t.Fatalf("struct santa_tcp_emit is now\n\t%s\nbut magic %#x stands for\n\t%s\n"+
			"give the new layout a new SANTA_TCP_EMIT_MAGIC (bpf/santa.h) and record it in emitLayouts",
			layout, santaTCPEmitMagic, want)
	}
}

// TestForeignEmitMetadataDropped puts beside this TC program an XDP program
// that, like a predecessor's during an upgrade, passes every frame with
// metadata in another layout (magic 0x53545345, as santad up to 3257ea6
// wrote it): TC drops those frames, neither sending segments from them nor
// handing their connection to the kernel, so a client cannot connect; with
// that XDP program gone, it can.
func TestForeignEmitMetadataDropped(t *testing.T) {
	tb := testbed.New(t)
	d, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.Mov.Imm(asm.R2, -8),
			asm.FnXdpAdjustMeta.Call(),
			asm.JNE.Imm(asm.R0, 0, "pass"),
			asm.LoadMem(asm.R2, asm.R6, 8, asm.Word), // xdp_md.data_meta
			asm.LoadMem(asm.R3, asm.R6, 0, asm.Word), // xdp_md.data
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 8),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.StoreImm(asm.R2, 0, 0x53545345, asm.Word),
			asm.StoreImm(asm.R2, 4, 0, asm.Word),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("pass"), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load the XDP program of another layout: %v", err)
	}
	defer foreign.Close()
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	startTCPServer(t, tb, addr)
	var xdp link.Link
	if err := tb.Server.Do(func() error {
		tc, err := link.AttachTCX(link.TCXOptions{Interface: tb.Server.Ifindex, Program: d.objs.SantaHandover, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		t.Cleanup(func() { tc.Close() })
		xdp, err = link.AttachXDP(link.XDPOptions{Program: foreign, Interface: tb.Server.Ifindex, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	dial := func() error {
		return tb.Client.Do(func() error {
			c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial(); err == nil {
		t.Fatal("a client connected through frames TC cannot read the metadata of: they reached the kernel")
	}
	if n := counterNames(t, d)["tcp_drop_emit_layout"]; n == 0 {
		t.Error("tcp_drop_emit_layout is 0 after the client's SYNs")
	}
	if err := xdp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err != nil {
		t.Fatalf("without the XDP program of another layout: %v", err)
	}
}

// TestHandoverSwappedBeforeXDP has a rule processor take over a pinned one
// while a sampler reads which programs the two links run: the new TC
// program goes in first, so at no moment does the new XDP program run
// beside the old TC program (which would misread its requests for segments
// if their layouts differed; the new TC program drops the old XDP
// program's, TestForeignEmitMetadataDropped).
func TestHandoverSwappedBeforeXDP(t *testing.T) {
	tb := testbed.New(t)
	linkPin := filepath.Join(mountBPFFS(t), "xdp-link")
	attachPinned := func() (xdp, tc ebpf.ProgramID) {
		d, err := Load(Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if err := tb.Server.Do(func() error {
			att, err := d.AttachPinned(tb.Server.Dev, AttachAuto, linkPin)
			if err == nil {
				err = att.Release()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		info, err := d.objs.SantaHandover.Info()
		if err != nil {
			t.Fatal(err)
		}
		tc, _ = info.ID()
		return programID(t, d), tc
	}
	oldXDP, oldTC := attachPinned()
	t.Cleanup(func() { os.Remove(linkPin); os.Remove(linkPin + "-handover") })
	var links []link.Link
	for _, pin := range []string{linkPin, linkPin + "-handover"} {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		links = append(links, l)
	}
	running := func(l link.Link) ebpf.ProgramID {
		info, err := l.Info()
		if err != nil {
			return 0
		}
		return info.Program
	}
	stop, done := make(chan struct{}), make(chan [2]ebpf.ProgramID)
	var samples, mixed int
	go func() {
		var last [2]ebpf.ProgramID
		for {
			select {
			case <-stop:
				done <- last
				return
			default:
			}
			last = [2]ebpf.ProgramID{running(links[0]), running(links[1])}
			samples++
			if last[0] != oldXDP && last[1] == oldTC {
				mixed++
			}
		}
	}()
	newXDP, newTC := attachPinned()
	close(stop)
	last := <-done
	if mixed > 0 {
		t.Errorf("in %d of %d samples the new XDP program ran beside the old TC program", mixed, samples)
	}
	if last != [2]ebpf.ProgramID{newXDP, newTC} {
		t.Errorf("the links run programs %v after the takeover, want the new ones %v", last, [2]ebpf.ProgramID{newXDP, newTC})
	}
}
