package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

func (a *app) nodesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes and what they serve; -o json/yaml prints an array of nodes",
		Long: `List the cluster's nodes: the live ones and those the placement record still
names (a dead node until its topics moved elsewhere), with their labels
(NODE_LABELS), the engines they can run, the workers and topics they serve
and their memory. -o json/yaml adds the topics placed on each node, its
worker processes and its start time. Callers of the default tenant and
admins only.`,
		Example: `  wmctl nodes
  wmctl nodes -o json | jq -r '.[] | select(.alive) | .id'`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			var resp *pb.ListNodesResponse
			err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.ListNodes(ctx, &pb.ListNodesRequest{})
				return err
			})
			if err != nil {
				return err
			}
			return a.emit(func() ([]byte, error) { return listJSON(resp.GetNodes()) }, nodesTable(resp.GetNodes()))
		}),
	}
}

func (a *app) drainCmd() *cobra.Command {
	var undo bool
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every topic off a node (make before break) and give it none; --undo gives it topics again",
		Long: `Drain NODE: the placement workflow moves its topics to other nodes, each new
node attaching a topic before NODE lets it go, and gives NODE no topics until
it is undrained (wmctl drain --undo NODE). wmctl returns once the change is
recorded, not once every topic moved: wmctl nodes shows the progress. Admins
only.`,
		Example: `  wmctl drain node-2
  wmctl drain --undo node-2`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			wait := "draining node"
			if undo {
				wait = "undraining node"
			}
			var resp *pb.DrainNodeResponse
			err := a.apiCall(cmd.Context(), wait, func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: args[0], Undrain: undo})
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(resp, func(w io.Writer) {
				if undo {
					fmt.Fprintln(w, "undrained", args[0])
				} else {
					fmt.Fprintln(w, "drained", args[0], "(its topics move to other nodes; wmctl nodes shows them)")
				}
			})
		}),
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "undrain: the node may be given topics again")
	return cmd
}
