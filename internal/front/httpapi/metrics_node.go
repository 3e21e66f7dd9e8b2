package httpapi

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// nodeGatherer adds node=NAME to every metric a cluster node serves, so
// that one scrape config over all nodes tells them apart.
type nodeGatherer struct {
	g    prometheus.Gatherer
	node string
}

func (n nodeGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := n.g.Gather()
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == "node" }) {
				continue
			}
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("node"), Value: proto.String(n.node)})
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		}
	}
	return mfs, err
}
