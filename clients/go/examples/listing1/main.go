// Command listing1 is the paper's Listing 1 with the Go client: an
// unprivileged UDP server that lets the kernel answer "Hello" with "COMSYS"
// and serves everything else itself. The namespace tests run it as uid nobody.
//
//	listing1 [--socket SANTA_SOCKET_PATH] ADDR PORT
//
// It prints "ready cookie=N rule=ID" once the rule is in; a datagram "stats"
// gets "hits=N" (the rule's hits), any other datagram "app:" + itself.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
)

func main() {
	socket := flag.String("socket", "", "santad control socket (default $SANTA_SOCKET or "+api.DefaultSocket+")")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: listing1 [--socket PATH] ADDR PORT")
		os.Exit(2)
	}
	if err := run(*socket, flag.Arg(0), flag.Arg(1)); err != nil {
		fmt.Fprintln(os.Stderr, "listing1:", err)
		os.Exit(1)
	}
}

func run(socketPath, addr, port string) error {
	conn, err := net.ListenPacket("udp", net.JoinHostPort(addr, port))
	if err != nil {
		return err
	}
	defer conn.Close()
	c, err := santa.Dial(socketPath)
	if err != nil {
		return err
	}
	defer c.Close()
	target, err := santa.Socket(conn.(*net.UDPConn))
	if err != nil {
		return err
	}
	ids, err := c.Add(target, []api.Rule{{
		Conditions: []api.Condition{santa.Match(0, []byte("Hello"))},
		Processors: []api.Processor{santa.Put(0, []byte("COMSYS"))},
		ReplyLen:   6,
	}})
	if err != nil {
		return err
	}
	info, err := c.Bind(target, santa.SampleOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("ready cookie=%d rule=%d\n", info.Cookie, ids[0])

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-stop; conn.Close() }()
	buf := make([]byte, 2048)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return nil // closed by the signal
		}
		reply := append([]byte("app:"), buf[:n]...)
		if string(buf[:n]) == "stats" {
			st, err := c.Stats(santa.Cookie(info.Cookie), ids[0])
			if err != nil {
				return err
			}
			reply = []byte("hits=" + strconv.FormatUint(st[0].Hits, 10))
		}
		if _, err := conn.WriteTo(reply, from); err != nil {
			return err
		}
	}
}
