package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/sdk"
	"github.com/spf13/cobra"
)

func newRunCodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run-code [flags] ID (-c CODE | FILE | -)",
		Short: "Run code in a sandbox's code interpreter (Python, bash, JavaScript)",
		Long: "Runs code in the stateful interpreter of a sandbox of the code-interpreter image, like\n" +
			"a Jupyter cell: variables, imports and loaded data stay for the next run in the same\n" +
			"context. stdout and stderr stream as they are printed; the value of the last expression\n" +
			"is printed after them; images (a matplotlib figure) are saved with --save-images.\n" +
			"Exits 1 if the code raised (the traceback goes to stderr). A sleeping sandbox is woken.\n" +
			"Contexts (a kernel each) are listed, created, restarted and removed with clade code-context.",
		Example: "  clade create --image code-interpreter --name nb\n" +
			"  clade run-code nb -c 'import pandas as pd; df = pd.DataFrame({\"x\": range(5)}); df.x.sum()'\n" +
			"  clade run-code nb -c 'len(df)'                      # state is kept\n" +
			"  clade run-code nb --save-images out/ plot.py        # figures as out/1.png...\n" +
			"  echo 'echo $HOME' | clade run-code --lang bash nb -",
		Args:              nargs(1, 2),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	fs := cmd.Flags()
	lang := fs.String("lang", "", "the `language`: python (default), bash or js")
	ctxID := fs.String("context", "", "run in this context `ID` (see clade code-context) instead of the language's default one")
	code := fs.StringP("code", "c", "", "the `CODE` to run (instead of a FILE or -)")
	var env multi
	fs.Var(&env, "env", "environment variable `K=V` for this run only (repeatable)")
	timeout := fs.Duration("timeout", 0, "interrupt the run after this long, e.g. 30s: the context keeps its state, unless its kernel\n"+
		"ignores the interrupt for 5s more (then it is restarted, its state lost)")
	images := fs.String("save-images", "", "save the run's images (PNG, JPEG, SVG) into this `DIR`")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ref := args[0]
		src := *code
		switch {
		case len(args) == 2 && cmd.Flags().Changed("code"):
			return usagef(cmd, "give the code with -c or as FILE, not both")
		case len(args) == 2 && args[1] == "-":
			b, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return err
			}
			src = string(b)
		case len(args) == 2:
			b, err := os.ReadFile(args[1])
			if err != nil {
				return badArg("%v", err)
			}
			src = string(b)
		case !cmd.Flags().Changed("code"):
			return usagef(cmd, "no code: give -c CODE, a FILE, or - for stdin\nUsage: %s", cmd.UseLine())
		}
		if strings.TrimSpace(src) == "" {
			return usagef(cmd, "the code is empty")
		}
		if *lang != "" && *ctxID != "" {
			return usagef(cmd, "give --lang or --context, not both (a context has its language)")
		}
		if *timeout < 0 {
			return usagef(cmd, "--timeout %s: give a positive duration, e.g. 30s", *timeout)
		}
		if err := checkEnv(env); err != nil {
			return usagef(cmd, "%v", err)
		}
		if *images != "" {
			if err := os.MkdirAll(*images, 0o755); err != nil {
				return badArg("--save-images: %v", err)
			}
		}
		envs := map[string]string{}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			envs[k] = v
		}
		c, err := sdk.New(host)
		if err != nil {
			return err
		}
		out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
		saved := 0
		save := func(ev sdk.CodeEvent) error {
			for _, im := range []struct{ ext, data string }{{"png", ev.PNG}, {"jpeg", ev.JPEG}} {
				if im.data == "" {
					continue
				}
				b, err := base64.StdEncoding.DecodeString(im.data)
				if err != nil {
					return fmt.Errorf("an image of the run is not base64: %v", err)
				}
				saved++
				p := filepath.Join(*images, fmt.Sprintf("%d.%s", saved, im.ext))
				if err := os.WriteFile(p, b, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(errw, "saved %s\n", p)
			}
			if ev.SVG != "" {
				saved++
				p := filepath.Join(*images, fmt.Sprintf("%d.svg", saved))
				if err := os.WriteFile(p, []byte(ev.SVG), 0o644); err != nil {
					return err
				}
				fmt.Fprintf(errw, "saved %s\n", p)
			}
			return nil
		}
		var saveErr error
		ex, err := c.RunCode(cmd.Context(), ref, sdk.RunCodeRequest{Code: src, Language: *lang, Context: *ctxID, Env: envs,
			TimeoutMS: int64(*timeout / time.Millisecond)}, func(ev sdk.CodeEvent) {
			switch ev.Type {
			case "stdout":
				fmt.Fprint(out, ev.Text)
			case "stderr":
				fmt.Fprint(errw, ev.Text)
			case "result":
				if *images != "" && saveErr == nil {
					saveErr = save(ev)
				}
			}
		})
		if err != nil {
			return err
		}
		if saveErr != nil {
			return saveErr
		}
		unsaved := 0
		for _, r := range ex.Results {
			if r.Text != "" && (r.IsMainResult || r.PNG == "" && r.JPEG == "" && r.SVG == "") {
				fmt.Fprintln(out, r.Text)
			}
			if *images == "" && (r.PNG != "" || r.JPEG != "" || r.SVG != "") {
				unsaved++
			}
		}
		if unsaved > 0 {
			fmt.Fprintf(errw, "(%d image(s) not shown: save them with --save-images DIR)\n", unsaved)
		}
		if ex.Error != nil {
			if ex.Error.Traceback != "" {
				fmt.Fprintln(errw, ex.Error.Traceback)
			} else {
				fmt.Fprintf(errw, "%s: %s\n", ex.Error.Name, ex.Error.Value)
			}
			return exitError{1}
		}
		return nil
	}
	return cmd
}
