package main

import (
	"github.com/spf13/cobra"
)

func newCompletionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: "Prints a completion script for verbs, flags and their values, and the daemon's\n" +
			"sandbox ids and names, snapshots, images, volumes and secrets (asked of the\n" +
			"daemon as you type; with the daemon down only verbs and flags complete).\n" +
			"The bash script needs the bash-completion package.",
		Example: "  source <(clade completion bash)      # or save it in /etc/bash_completion.d/clade\n" +
			"  source <(clade completion zsh)       # after compinit\n" +
			"  clade completion fish | source       # or save it in ~/.config/fish/completions/clade.fish",
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef(cmd, "give one shell: bash, zsh or fish")
			}
			switch args[0] {
			case "bash", "zsh", "fish":
				return nil
			}
			return usagef(cmd, "unknown shell %q: give bash, zsh or fish", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			default:
				return root.GenFishCompletion(out, true)
			}
		},
	}
}
