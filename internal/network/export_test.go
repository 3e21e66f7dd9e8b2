package network

import (
	"net/netip"
	"time"
)

// Abandon stops n's pool filler and resolvers and leaves every slot, rule
// and record on the machine, as a daemon killed with SIGKILL would.
func (n *Network) Abandon() {
	n.mu.Lock()
	n.closed = true
	close(n.stop)
	n.mu.Unlock()
	n.filling.Wait()
	n.dns.shutdown()
	n.claim.Close() // the kernel drops a killed daemon's lock
}

// SetPolicyUnlimited is SetPolicy without the limit on the number of
// entries, to make the kernel refuse a policy.
func (n *Network) SetPolicyUnlimited(owner string, p Policy) error {
	r, _, err := p.compileUnlimited()
	if err != nil {
		return err
	}
	return n.setRules(owner, r)
}

// AllowedByName returns the addresses owner's slot allows because allowed
// names resolved to them, each with the timeout it was added with.
func (n *Network) AllowedByName(owner string) (map[netip.Addr]time.Duration, error) {
	s, ok := n.Lookup(owner)
	if !ok {
		return nil, nil
	}
	c, err := newConn()
	if err != nil {
		return nil, err
	}
	els, err := c.GetSetElements(n.rs.dnsSet(s.Index))
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]time.Duration{}
	for _, e := range els {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			out[a] = e.Timeout
		}
	}
	return out, nil
}
