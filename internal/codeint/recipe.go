// Package codeint is clade's code interpreter: the built-in image
// code-interpreter (Debian's Python, Jupyter kernel machinery and data
// libraries, Node.js) and the interpreter server that runs inside its
// sandboxes on port Port, speaking the wire of E2B's code interpreter
// (POST /execute answering newline-delimited JSON, /contexts). The server
// is a process of the sandbox, so a sandbox's kernels sleep, wake and fork
// with it. See docs/codeint.md.
package codeint

import (
	"context"
	_ "embed"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/image"
)

// Image is the built-in image the interpreter runs in.
const Image = "code-interpreter"

// Port is the port the interpreter server listens on inside the sandbox
// (E2B's).
const Port = 49999

// ServerPath is where the image holds the server it was built with: the
// mark of an image that can run the interpreter, and the server started
// when none is delivered. The server that runs is the daemon's own
// (ServerSource), which the start script (StartCommand) reads on its
// stdin and installs at RunServerPath, so a server fixed in clade reaches
// sandboxes of an image built (and cached) before.
const ServerPath = "/opt/clade/codeint/server.py"

// RunServerPath is where the start script installs the server it starts.
const RunServerPath = "/run/clade-codeint/server.py"

//go:embed server.py
var serverSource []byte

// ServerSource returns the server this daemon delivers (embedded).
func ServerSource() []byte { return serverSource }

// Packages are what the image holds beyond debootstrap's minbase: the
// kernels and what a data-analysis agent expects to import, plus the
// everyday tools of E2B's base template that cost little.
var Packages = []string{
	"python3", "python3-ipykernel", "python3-jupyter-client",
	"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-scipy", "python3-requests",
	"python-is-python3", "nodejs",
	// Virtual packages debootstrap does not resolve: their providers.
	"python3-cffi-backend", "libboost-regex1.74.0",
	"ca-certificates", "curl", "git", "procps", "fonts-dejavu-core",
}

func init() {
	image.RegisterRecipe(image.Recipe{Name: Image, About: "bookworm + Python kernels (ipykernel), numpy, pandas, matplotlib, scipy, Node.js", Include: Packages, Post: post,
		// Hot-pool sandboxes run the server (this daemon's, on stdin) and
		// its default Python kernel before a create claims one.
		Warm: startScript, WarmStdin: serverSource})
}

// post installs the server into the image.
func post(_ context.Context, rootfs string) error {
	return InstallServer(rootfs)
}

// InstallServer writes the interpreter server under the root filesystem
// rootfs.
func InstallServer(rootfs string) error {
	p := filepath.Join(rootfs, ServerPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, serverSource, 0o755)
}
