package network

// Abandon stops n's pool filler and resolvers and leaves every slot, rule
// and record on the machine, as a daemon killed with SIGKILL would.
func (n *Network) Abandon() {
	n.mu.Lock()
	n.closed = true
	close(n.stop)
	n.mu.Unlock()
	n.filling.Wait()
	n.dns.shutdown()
}
