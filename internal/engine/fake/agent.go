package fake

import (
	"encoding/json"
	"net"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/guest"
)

// newGuest returns a guest connection served by a stand-in agent in this
// process over a pipe. It answers pings and ends every call at once with
// exit code 0: enough for the lifecycle's own calls (a reconfigure after a
// restore), and nothing that runs a process. Tests that exec use runsc.
func newGuest() *guest.Conn {
	g := guest.NewConn()
	host, agent := net.Pipe()
	go func() { _ = g.Serve(host) }()
	go serveStandIn(agent)
	return g
}

func serveStandIn(nc net.Conn) {
	defer nc.Close()
	c := wire.NewConn(nc)
	hello, _ := json.Marshal(wire.HelloMsg{Version: wire.Version, PID: 1, Boot: 1, Features: []string{wire.FeatureAuth}})
	if c.Write(wire.Hello, 0, hello) != nil {
		return
	}
	exit, _ := json.Marshal(wire.ExitMsg{Code: 0})
	r := wire.NewReader(nc)
	for {
		f, err := r.Read()
		if err != nil {
			return
		}
		switch f.Type {
		case wire.Ping:
			err = c.Write(wire.Pong, f.Channel, append([]byte(nil), f.Payload...))
		case wire.Key:
			err = c.Write(wire.Key, 0, nil)
		case wire.Open:
			err = c.Write(wire.Exit, f.Channel, exit)
		}
		if err != nil {
			return
		}
	}
}
