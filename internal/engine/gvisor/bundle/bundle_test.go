package bundle

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestMarshal(t *testing.T) {
	b, err := Marshal(Spec{Args: []string{"/init"}, Env: []string{"A=1"}, Hostname: "h", RootFS: "/r", Cgroup: "/c/x",
		MemoryMiB: 64, CPUs: 0.5, ExtraCaps: []string{"CAP_SYS_ADMIN"},
		Mounts: []Mount{{Source: "/s", Destination: "/d", ReadOnly: true}}, NetNS: "/run/netns/n"})
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Process struct {
			Args         []string
			Env          []string
			Capabilities struct{ Bounding []string }
		}
		Root     struct{ Path string }
		Hostname string
		Mounts   []struct {
			Destination, Source string
			Options             []string
		}
		Linux struct {
			CgroupsPath string
			Resources   struct {
				Memory struct{ Limit int64 }
				CPU    struct{ Quota, Period int64 }
			}
			Namespaces []struct{ Type, Path string }
		}
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"args", slices.Equal(spec.Process.Args, []string{"/init"})},
		{"env", slices.Contains(spec.Process.Env, "A=1") && slices.Contains(spec.Process.Env, "HOSTNAME=h") && slices.Contains(spec.Process.Env, BaseEnv[0])},
		{"caps", slices.Contains(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") && slices.Contains(spec.Process.Capabilities.Bounding, "CAP_KILL")},
		{"root", spec.Root.Path == "/r" && spec.Hostname == "h"},
		{"mount", len(spec.Mounts) == 4 && spec.Mounts[3].Destination == "/d" && slices.Contains(spec.Mounts[3].Options, "ro")},
		{"cgroup", spec.Linux.CgroupsPath == "/c/x"},
		{"memory", spec.Linux.Resources.Memory.Limit == 64<<20},
		{"cpu", spec.Linux.Resources.CPU.Quota == 50000 && spec.Linux.Resources.CPU.Period == 100000},
		{"netns", slices.ContainsFunc(spec.Linux.Namespaces, func(n struct{ Type, Path string }) bool {
			return n.Type == "network" && n.Path == "/run/netns/n"
		})},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s wrong in %s", c.name, b)
		}
	}
	if _, err := Marshal(Spec{RootFS: "/r"}); err == nil {
		t.Error("a spec without args was accepted")
	}
}
