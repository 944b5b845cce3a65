package main

import (
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/rulefile"
	"github.com/spf13/cobra"
)

// printJSON prints v for --json with every field of its structs, zero ones
// included: the protocol leaves zero values out (`omitempty`), but a
// script should not have to know which fields can be absent (`jq
// 'select(.hits == 0)'` must find a rule never hit).
func printJSON(w io.Writer, v any) error {
	return printIndented(w, allFields(reflect.ValueOf(v)))
}

// printRuleFile prints rules as a rule file (`santa rules ls --json`),
// which leaves out what is zero, as a file written by hand would.
func printRuleFile(w io.Writer, rules []api.Rule) error {
	return printIndented(w, rulefile.FromAPI(rules))
}

func printIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonObject is a struct's fields in their order, for printJSON.
type jsonObject []jsonField

type jsonField struct {
	name  string
	value any
}

func (o jsonObject) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(f.name)
		value, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(value)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// allFields is v with its structs as jsonObjects of all their exported
// fields (named as their json tags name them, embedded structs' fields
// inline), and nil slices as empty ones.
func allFields(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	if t := v.Type(); t.Implements(reflect.TypeFor[json.Marshaler]()) || t.Implements(reflect.TypeFor[encoding.TextMarshaler]()) {
		return v.Interface() // as it prints itself
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return allFields(v.Elem())
	case reflect.Struct:
		return structFields(v)
	case reflect.Slice, reflect.Array:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = allFields(v.Index(i))
		}
		return out
	case reflect.Map:
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[fmt.Sprint(it.Key().Interface())] = allFields(it.Value())
		}
		return out
	}
	return v.Interface()
}

func structFields(v reflect.Value) jsonObject {
	var o jsonObject
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			o = append(o, structFields(v.Field(i))...)
			continue
		case name == "":
			name = f.Name
		}
		o = append(o, jsonField{name, allFields(v.Field(i))})
	}
	return o
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// addr shows a socket as address/protocol, e.g. 198.18.0.1:53/udp or [::]:80/tcp.
func addr(s api.SocketInfo) string { return s.AddrPort().String() + "/" + protoName(s.Protocol) }

// socketJSON is a socket as --json prints it: the protocol's fields (the
// address as its bytes in hex) and the bound address and port as text.
type socketJSON struct {
	api.SocketInfo
	Bound string `json:"bound"` // e.g. "198.18.0.1:53", "[::]:80"
}

func socketsJSON(socks []api.SocketInfo) []socketJSON {
	out := make([]socketJSON, len(socks))
	for i, s := range socks {
		out[i] = socketJSON{s, s.AddrPort().String()}
	}
	return out
}

func protoName(p uint32) string {
	switch p {
	case api.ProtocolUDP:
		return "udp"
	case api.ProtocolTCP:
		return "tcp"
	}
	return "proto" + strconv.FormatUint(uint64(p), 10)
}

func statusCmd(e env, g *globals) *cobra.Command {
	return readFlag(&cobra.Command{
		Use:   "status",
		Short: "Show santad's state, your quota and the rule processor's counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			info, counters, err := c.Health()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(e.stdout, map[string]any{"daemon": info, "counters": counters})
			}
			w := table(e.stdout)
			fmt.Fprintf(w, "santad\t%s (protocol %d), pid %d, up %s\n", info.Version, info.Protocol, info.PID,
				time.Duration(info.UptimeSeconds)*time.Second)
			var ifs []string
			for _, i := range info.Interfaces {
				ifs = append(ifs, i.Name+" ("+i.Mode+")")
			}
			fmt.Fprintf(w, "interfaces\t%s\n", strings.Join(ifs, ", "))
			for _, i := range info.Interfaces {
				if i.Peer != "" {
					fmt.Fprintf(w, "veth peer of %s\t%s\n", i.Name, i.Peer)
				}
			}
			fmt.Fprintf(w, "rules\t%d of %d, on %d sockets\n", info.Rules, info.MaxRules, info.Sockets)
			fmt.Fprintf(w, "rule data\t%d of %d bytes\n", info.DataBytes, info.MaxDataBytes)
			quota := func(used, limit uint64) string {
				if limit == 0 {
					return fmt.Sprintf("%d (no quota)", used)
				}
				return fmt.Sprintf("%d of %d", used, limit)
			}
			fmt.Fprintf(w, "you (uid %d)\trules %s, bytes %s, rule sets %s\n", info.UID, quota(info.UsedRules, info.QuotaRules),
				quota(info.UsedBytes, info.QuotaBytes), quota(info.UsedRulesets, info.QuotaRulesets))
			names := make([]string, 0, len(counters))
			for n := range counters {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				if counters[n] != 0 || n == "answered" {
					fmt.Fprintf(w, "%s\t%d\n", n, counters[n])
				}
			}
			return w.Flush()
		},
	}, g)
}

// socketFlag adds the --socket cookie flag a rule-set command needs.
func socketFlag(c *cobra.Command, cookie *uint64, required bool) {
	c.Flags().Uint64Var(cookie, "socket", 0, "the rule set's socket cookie (see 'santa rules ls')")
	if required {
		c.MarkFlagRequired("socket")
	}
}

func rulesCmd(e env, g *globals) *cobra.Command {
	rules := &cobra.Command{
		Use:   "rules",
		Short: "List, add, change and remove rules",
	}
	var cookie uint64
	var lsTag string
	ls := readFlag(&cobra.Command{
		Use:   "ls",
		Short: "List the sockets with rule sets, or with --socket that socket's rules",
		Long: `Without --socket, list the rule sets you may see (all of them as root).
With --socket, list that socket's rules with their hits (--tag T: only those
tagged T; --tag "": only the untagged ones, which 'santa rules rm --tag ""'
removes); --json prints a rule file that 'santa rules replace' takes back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cookie == 0 && cmd.Flags().Changed("tag") {
				return fmt.Errorf("--tag lists the rules of one socket: give --socket too")
			}
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if cookie == 0 {
				return listSockets(e, g, c)
			}
			var rules []api.Rule
			if cmd.Flags().Changed("tag") {
				rules, err = rulesTagged(c, cookie, lsTag)
			} else {
				rules, err = c.ListRules(santa.Cookie(cookie))
			}
			if err != nil {
				return err
			}
			return listRules(e, g, c, cookie, rules)
		},
	}, g)
	socketFlag(ls, &cookie, false)
	ls.Flags().StringVar(&lsTag, "tag", "", "with --socket: list only the rules with this tag (\"\": the untagged ones)")

	add := ruleFileCmd(e, g, false, "add FILE", "Add the rules of a rule file (JSON or YAML; - for stdin), all or none",
		func(c *santa.Client, t santa.Target, r []api.Rule) ([]uint64, error) { return c.Add(t, r) })
	replace := ruleFileCmd(e, g, true, "replace FILE", "Replace all rules of the socket by those of a rule file, atomically",
		func(c *santa.Client, t santa.Target, r []api.Rule) ([]uint64, error) { return c.Replace(t, r) })
	modify := ruleFileCmd(e, g, false, "modify FILE", "Change rules in place: each rule in the file names its id",
		func(c *santa.Client, t santa.Target, r []api.Rule) ([]uint64, error) {
			for i, rule := range r {
				if rule.ID == 0 {
					return nil, fmt.Errorf("rule %d has no id: modify needs the id of the rule it changes", i)
				}
			}
			if err := c.Modify(t, r); err != nil {
				return nil, err
			}
			ids := make([]uint64, len(r))
			for i := range r {
				ids[i] = r[i].ID
			}
			return ids, nil
		})

	var rmCookie uint64
	var rmTag string
	rm := &cobra.Command{
		Use:   "rm (ID... | --tag T)",
		Short: "Remove rules by id, or every rule with a tag, all or none",
		Long: `Remove rules by id, or every rule with a tag, all or none.
With --tag, the socket's rules tagged T (e.g. santa-dns: what a controller
that is gone left behind) are removed.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 0) == !cmd.Flags().Changed("tag") {
				return fmt.Errorf("give rule ids or --tag T (not both)")
			}
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			switch {
			case rmTag != "": // santad finds them: one request, however many
				ids, err = c.DeleteTagged(santa.Cookie(rmCookie), rmTag)
			case cmd.Flags().Changed("tag"): // the untagged ones: listed, then deleted by id
				var untagged []api.Rule
				if untagged, err = rulesTagged(c, rmCookie, ""); err == nil && len(untagged) > 0 {
					for _, r := range untagged {
						ids = append(ids, r.ID)
					}
					err = c.Delete(santa.Cookie(rmCookie), ids)
				}
			default:
				err = c.Delete(santa.Cookie(rmCookie), ids)
			}
			if err != nil {
				return err
			}
			if len(ids) == 0 {
				fmt.Fprintf(e.stdout, "no rules tagged %q\n", rmTag)
				return nil
			}
			fmt.Fprintf(e.stdout, "removed %d rules\n", len(ids))
			return nil
		},
	}
	socketFlag(rm, &rmCookie, true)
	rm.Flags().StringVar(&rmTag, "tag", "", "remove every rule of the socket with this tag (\"\": the untagged ones)")
	rules.AddCommand(ls, add, replace, modify, rm)
	return rules
}

// rulesTagged returns the socket's rules tagged tag; for "" those without
// a tag, which list_rules cannot select (no tag there means every rule).
func rulesTagged(c *santa.Client, cookie uint64, tag string) ([]api.Rule, error) {
	if tag != "" {
		return c.ListTagged(santa.Cookie(cookie), tag)
	}
	rules, err := c.ListRules(santa.Cookie(cookie))
	if err != nil {
		return nil, err
	}
	var untagged []api.Rule
	for _, r := range rules {
		if r.Tag == "" {
			untagged = append(untagged, r)
		}
	}
	return untagged, nil
}

func parseIDs(args []string) ([]uint64, error) {
	ids := make([]uint64, len(args))
	for i, a := range args {
		id, err := strconv.ParseUint(a, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("%q is not a rule id (a positive number from 'santa rules ls --socket N')", a)
		}
		ids[i] = id
	}
	return ids, nil
}

// ruleFileCmd builds a command that sends a rule file's rules to a socket;
// a file without rules is an error unless emptyOK (replace: remove them all).
func ruleFileCmd(e env, g *globals, emptyOK bool, use, short string, do func(*santa.Client, santa.Target, []api.Rule) ([]uint64, error)) *cobra.Command {
	var cookie uint64
	var lifetime time.Duration
	var tag string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.
The rule file format is in docs/cli.md: under the key rules, a list of
rules, each with conditions (offset and text, hex or base64), processors
(put or copy) and reply_len; 'santa rules ls --socket C --json' prints one.
With --lifetime, santad removes each rule that has no expires of its own
that long after now; --tag tags each rule that has no tag of its own.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if lifetime < 0 {
				return fmt.Errorf("--lifetime %v: must not be negative (0: the rules do not expire)", lifetime)
			}
			if err := api.CheckTag(tag); err != nil {
				return fmt.Errorf("--tag: %w", err)
			}
			var data []byte
			var err error
			if args[0] == "-" {
				data, err = io.ReadAll(e.stdin)
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return err
			}
			rules, err := rulefile.Parse(data)
			if err != nil {
				return err
			}
			if len(rules) == 0 && !emptyOK {
				return fmt.Errorf("%s holds no rules (the file format is in docs/cli.md)", args[0])
			}
			for i := range rules {
				if rules[i].Tag == "" {
					rules[i].Tag = tag
				}
			}
			if lifetime > 0 {
				// the whole second at or after now + lifetime: never early
				expires := uint64(time.Now().Add(lifetime + time.Second - 1).Unix())
				for i := range rules {
					if rules[i].Expires == 0 {
						rules[i].Expires = expires
					}
				}
			}
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ids, err := do(c, santa.Cookie(cookie), rules)
			if err != nil {
				return err
			}
			for _, id := range ids {
				fmt.Fprintln(e.stdout, id)
			}
			return nil
		},
	}
	socketFlag(cmd, &cookie, true)
	cmd.Flags().DurationVar(&lifetime, "lifetime", 0, "santad removes each rule without its own expires this long after now (e.g. 30s, 5m, 2h; 0: never)")
	cmd.Flags().StringVar(&tag, "tag", "", "tag each rule without a tag of its own (who added it; santa rules rm --tag removes them)")
	return cmd
}

func listSockets(e env, g *globals, c *santa.Client) error {
	socks, err := c.ListSockets()
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(e.stdout, socketsJSON(socks))
	}
	w := table(e.stdout)
	fmt.Fprintln(w, "SOCKET\tADDRESS\tOWNER\tPID\tRULES\tBYTES\tHITS\tREPLY_BYTES")
	for _, s := range socks {
		fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", s.Cookie, addr(s), s.Owner, s.PID, s.Rules, s.TemplateBytes, s.Hits, s.ReplyBytes)
	}
	return w.Flush()
}

func listRules(e env, g *globals, c *santa.Client, cookie uint64, rules []api.Rule) error {
	if g.json {
		return printRuleFile(e.stdout, rules)
	}
	stats, err := c.Stats(santa.Cookie(cookie))
	if err != nil {
		return err
	}
	hits := map[uint64]uint64{}
	for _, s := range stats {
		hits[s.ID] = s.Hits
	}
	w := table(e.stdout)
	fmt.Fprintln(w, "ID\tVERSION\tPRIORITY\tTAG\tCONDITIONS\tREPLY\tHITS")
	for _, r := range rules {
		tag := r.Tag
		if tag == "" {
			tag = "-"
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\t%d B\t%d\n", r.ID, r.Version, r.Priority, tag, matches(r), r.ReplyLen, hits[r.ID])
	}
	return w.Flush()
}

// matches shows what a rule matches: its conditions (@offset="pattern", a
// mask in hex after a slash), its request length bounds (len=N, len>=N,
// len<=N) and its guards (guard=slot@version); "close" ends it if its reply
// ends the connection.
func matches(r api.Rule) string {
	var out []string
	for _, cd := range r.Conditions {
		c := fmt.Sprintf("@%d=%s", cd.Offset, short(cd.Pattern))
		if len(cd.Mask) > 0 {
			c += "/" + hex.EncodeToString(cd.Mask)
		}
		out = append(out, c)
	}
	if r.MinLen > 0 && r.MinLen == r.MaxLen {
		out = append(out, fmt.Sprintf("len=%d", r.MinLen))
	} else {
		if r.MinLen > 0 {
			out = append(out, fmt.Sprintf("len>=%d", r.MinLen))
		}
		if r.MaxLen > 0 {
			out = append(out, fmt.Sprintf("len<=%d", r.MaxLen))
		}
	}
	for _, g := range r.Guards {
		out = append(out, fmt.Sprintf("guard=%d@%d", g.Slot, g.Version))
	}
	if r.Close {
		out = append(out, "close")
	}
	if r.Expires != 0 {
		out = append(out, "expires="+time.Unix(int64(r.Expires), 0).UTC().Format(time.RFC3339))
	}
	return strings.Join(out, " ")
}

// short shows a pattern as quoted text, cut to a table column.
func short(b []byte) string {
	s := strconv.Quote(string(b))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

func statsCmd(e env, g *globals) *cobra.Command {
	var cookie uint64
	cmd := readFlag(&cobra.Command{
		Use:   "stats",
		Short: "Per-rule hits and reply bytes of a socket, or per-socket totals",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if cookie == 0 {
				return listSockets(e, g, c)
			}
			stats, err := c.Stats(santa.Cookie(cookie))
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(e.stdout, stats)
			}
			w := table(e.stdout)
			fmt.Fprintln(w, "ID\tHITS\tBYTES")
			for _, s := range stats {
				fmt.Fprintf(w, "%d\t%d\t%d\n", s.ID, s.Hits, s.Bytes)
			}
			return w.Flush()
		},
	}, g)
	socketFlag(cmd, &cookie, false)
	return cmd
}

func attachCmd(e env, g *globals) *cobra.Command {
	var pid, fd int
	var port string
	var sample santa.SampleOptions
	cmd := readFlag(&cobra.Command{
		Use:   "attach (--pid PID --fd FD | --port PORT/udp | --port PORT/tcp)",
		Short: "Take over the sockets of a running, unmodified server (root)",
		Long: `attach gives the sockets of a running server rule sets, so rules can be
added for them by cookie: --pid and --fd name one socket of one process (a
bound UDP socket or a listening TCP socket), --port PORT/udp every UDP socket
bound to that port (all workers, IPv4 and IPv6), --port PORT/tcp every TCP
socket listening on it. Needs root: santad takes the sockets with pidfd_getfd.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byPort := port != "" && pid == 0
			if !byPort && (pid == 0 || port != "" || !cmd.Flags().Changed("fd")) {
				return errors.New("give --pid and --fd, or --port PORT/udp or PORT/tcp")
			}
			if cmd.Flags().Changed("sample-rate") && sample.Bytes == 0 {
				return errors.New("--sample-rate needs --sample-bytes (how much of each missed request to copy): alone it changes nothing")
			}
			var p uint16
			var proto uint32
			if byPort {
				var err error
				if p, proto, err = parsePortProto(port); err != nil {
					return err
				}
			}
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if sample.Bytes == 0 {
				sample = santa.SampleOptions{} // no sampling asked for: leave it as it is
			}
			// the sampling goes in the bind request: santad binds all or none
			var socks []api.SocketInfo
			if byPort {
				socks, err = c.BindPortProtocol(p, proto, sample)
			} else {
				var s api.SocketInfo
				s, err = c.BindPID(pid, fd, sample)
				socks = []api.SocketInfo{s}
			}
			if err != nil {
				return err
			}
			if api.LoopbackOnly(socks) {
				fmt.Fprintln(e.stderr, "santa: warning: "+api.LoopbackWarning)
			}
			if g.json {
				return printJSON(e.stdout, socketsJSON(socks))
			}
			w := table(e.stdout)
			fmt.Fprintln(w, "SOCKET\tADDRESS\tPID\tNEW")
			for _, s := range socks {
				fmt.Fprintf(w, "%d\t%s\t%d\t%v\n", s.Cookie, addr(s), s.PID, s.Created)
			}
			return w.Flush()
		},
	}, g)
	cmd.Flags().IntVar(&pid, "pid", 0, "process holding the socket")
	cmd.Flags().IntVar(&fd, "fd", 0, "the socket's fd number in that process (see ls -l /proc/PID/fd)")
	cmd.Flags().StringVar(&port, "port", "", "take every UDP socket bound to this port (e.g. 53/udp), or every TCP socket listening on it (e.g. 80/tcp)")
	cmd.Flags().Uint32Var(&sample.Bytes, "sample-bytes", 0, "copy this many bytes of each missed request to subscribers (at most 1472: a whole request)")
	cmd.Flags().Uint32Var(&sample.Rate, "sample-rate", 1000, "miss samples per second and CPU, with --sample-bytes")
	return cmd
}

// parsePort reads a UDP port, N or N/udp, for the controllers (UDP only).
func parsePort(s string) (uint16, error) {
	p, proto, err := parsePortProto(s)
	if err == nil && proto != api.ProtocolUDP {
		return 0, fmt.Errorf("port %q: only udp sockets can be attached here", s)
	}
	return p, err
}

// parsePortProto reads N/udp, N/tcp or N (udp) as attach --port takes it.
func parsePortProto(s string) (uint16, uint32, error) {
	num, name, found := strings.Cut(s, "/")
	name = strings.ToLower(name) // 53/UDP too
	proto := uint32(api.ProtocolUDP)
	switch {
	case !found || name == "udp":
	case name == "tcp":
		proto = api.ProtocolTCP
	default:
		return 0, 0, fmt.Errorf("port %q: only udp and tcp sockets can be attached, e.g. 53/udp or 80/tcp", s)
	}
	p, err := strconv.ParseUint(num, 10, 16)
	if err != nil || p == 0 {
		return 0, 0, fmt.Errorf("port %q: want a number from 1 to 65535, e.g. 53/udp", s)
	}
	return uint16(p), proto, nil
}

func detachCmd(e env, g *globals) *cobra.Command {
	var cookie uint64
	cmd := &cobra.Command{
		Use:   "detach --socket COOKIE",
		Short: "Remove a socket's rule set and all its rules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.Unbind(santa.Cookie(cookie)); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "socket %d detached\n", cookie)
			return nil
		},
	}
	socketFlag(cmd, &cookie, true)
	return cmd
}
