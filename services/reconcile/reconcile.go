// Package reconcile owns what a node does after it comes up and while it runs:
// join (or start) the cluster-wide recovery workflow, reconcile this node
// against the catalog, report both in the health state, and keep reconciling
// periodically so that changes made through other nodes reach this one.
package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/workflows"
)

// Recover runs the recovery workflow and then reconciles this node, keeping
// the health state's recovery check up to date. Broken workers are counted,
// not fatal; failing to run recovery at all makes the node Unhealthy.
// continueAsNewAfter is the bound of the worker workflows recovery starts
// (WORKMANAGER_CONTINUE_AS_NEW_AFTER, as the API gives new ones).
func Recover(ctx context.Context, log *slog.Logger, c client.Client, n *node.Node, h *health.State, continueAsNewAfter int) error {
	h.Set(health.Recovery, health.Degraded, "recovery running")
	res, err := workflows.RunRecoveryWith(ctx, c, workflows.RecoveryInput{ContinueAsNewAfter: continueAsNewAfter})
	if err != nil {
		h.Set(health.Recovery, health.Unhealthy, err.Error())
		return err
	}
	rec, err := n.Reconcile(ctx)
	if err != nil {
		h.Set(health.Recovery, health.Unhealthy, err.Error())
		return err
	}
	detail := fmt.Sprintf("recovered %d of %d workers this node serves; cluster: recovered %d, failed %d (running %d, stopped %d)",
		rec.Here, rec.Share, res.Recovered, res.Failed+rec.Failed, rec.Running, rec.Stopped)
	log.Info("recovery finished", "recovered", res.Recovered, "failed", res.Failed, "failed_ids", res.FailedIDs,
		"running", rec.Running, "stopped", rec.Stopped, "node_failed", rec.Failed)
	h.Set(health.Recovery, health.Healthy, detail)
	if res.Failed+rec.Failed > 0 {
		h.Set("workers", health.Degraded, fmt.Sprintf("%d worker(s) could not be recovered: %v", res.Failed+rec.Failed, res.FailedIDs))
	} else {
		h.Set("workers", health.Healthy, "")
	}
	return nil
}

// RecoveryRetryMax caps the wait between two attempts of RecoverLoop.
const RecoveryRetryMax = 2 * time.Minute

// RecoverLoop brings the node up: with recoverAll it runs Recover, else
// only this node's first reconcile against the catalog (without which a
// node started with recovery off would serve nothing until its first
// periodic reconcile, and never with that off). A failed attempt is tried
// again after retry, doubling up to RecoveryRetryMax, until it succeeds or
// ctx ends: a recovery that failed once (Temporal or the state store not
// up yet) does not leave /readyz failing for ever. done, when set, is told
// the outcome of every recovery attempt; continueAsNewAfter is Recover's.
func RecoverLoop(ctx context.Context, log *slog.Logger, c client.Client, n *node.Node, h *health.State, recoverAll bool, continueAsNewAfter int,
	retry time.Duration, done func(time.Duration, error)) {
	wait := retry
	for {
		began := time.Now()
		var err error
		if recoverAll {
			err = Recover(ctx, log, c, n, h, continueAsNewAfter)
		} else {
			// Workers come back only when RecoverWorkers runs
			// (AwaitRecovery); this reconcile detaches nothing it should
			// keep and brings up nothing.
			n.HoldRestore()
			h.Set(health.Recovery, health.Degraded, "recovery on start disabled; reconciling this node")
			var rec node.ReconcileResult
			if rec, err = n.Reconcile(ctx); err == nil {
				h.Set(health.Recovery, health.Healthy, fmt.Sprintf("recovery on start disabled: %d running workers wait for RecoverWorkers; serving %d (stopped %d, failed %d)",
					rec.Held, rec.Here, rec.Stopped, rec.Failed))
			} else {
				h.Set(health.Recovery, health.Unhealthy, err.Error())
			}
		}
		if ctx.Err() != nil {
			return
		}
		if recoverAll && done != nil {
			done(time.Since(began), err)
		}
		if err == nil {
			return
		}
		log.Error("recovery failed; trying again", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, RecoveryRetryMax)
	}
}

// RecoveryDescriber reads the state of the recovery workflow
// (client.Client does).
type RecoveryDescriber interface {
	DescribeWorkflowExecution(ctx context.Context, workflowID, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error)
}

// AwaitRecovery, on a node whose restore is held (node.HoldRestore:
// WORKER_RECOVERY_ON_START=false), waits for a recovery (RecoverWorkers,
// or another node's start-up recovery) that completes after since, asking
// Temporal every poll; then it releases the hold and reconciles, bringing
// up every RUNNING worker this node serves. It returns at once when the
// restore is not held.
func AwaitRecovery(ctx context.Context, log *slog.Logger, c RecoveryDescriber, n *node.Node, h *health.State, since time.Time, poll time.Duration) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for n.RestoreHeld() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d, err := c.DescribeWorkflowExecution(ctx, workflows.RecoveryWorkflowID, "")
		if err != nil {
			continue // none yet (NotFound), or Temporal unreachable
		}
		info := d.GetWorkflowExecutionInfo()
		if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED || info.GetCloseTime() == nil || !info.GetCloseTime().AsTime().After(since) {
			continue
		}
		n.ReleaseRestore()
		rec, err := n.Reconcile(ctx)
		if err != nil {
			log.Warn("reconcile after RecoverWorkers failed; the periodic reconcile tries again", "err", err)
			continue
		}
		log.Info("RecoverWorkers ran: workers restored", "running", rec.Running, "failed", rec.Failed)
		h.Set(health.Recovery, health.Healthy, fmt.Sprintf("recovered by RecoverWorkers: %d of %d workers this node serves (running %d, stopped %d, failed %d)",
			rec.Here, rec.Share, rec.Running, rec.Stopped, rec.Failed))
	}
}

// ReconcileLoop reconciles the node every interval until ctx ends.
func ReconcileLoop(ctx context.Context, log *slog.Logger, n *node.Node, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if res, err := n.Reconcile(ctx); err != nil {
				log.Warn("periodic reconcile failed", "err", err)
			} else if res.Failed > 0 {
				log.Warn("periodic reconcile: some workers failed", "failed", res.Failed)
			}
		}
	}
}

// Temporal is the name of the health check of this node's lease: whether it
// can confirm its assignments with Temporal, where every lifecycle change is
// made.
const Temporal = "temporal"

// LeaseLoop keeps this node's lease on its workers. Every lease/4 it asks
// Temporal whether it answers (check). A node that has not had an answer for
// longer than lease fences itself (node.Fence: it detaches every worker and
// attaches none), because a stop or delete made meanwhile could not reach
// it; reconcile alone would bring those through the state store, but not
// when it is off, and not when the catalog is what cannot be read. When
// Temporal answers again the node unfences and reconciles against the
// catalog. So a node cut off from Temporal serves a worker that was
// stopped meanwhile for at most lease + lease/4. lease ≤ 0 disables it.
func LeaseLoop(ctx context.Context, log *slog.Logger, check func(context.Context) error, n *node.Node, h *health.State, lease time.Duration) {
	if lease <= 0 {
		return
	}
	every := lease / 4
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		err := check(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			last = time.Now()
			if n.Fenced() {
				n.Unfence()
				res, rerr := n.Reconcile(ctx)
				log.Info("Temporal answers again: node unfenced and reconciled", "running", res.Running, "err", rerr)
			}
			h.Set(Temporal, health.Healthy, fmt.Sprintf("lease confirmed (every %s, lease %s)", every, lease))
		case time.Since(last) > lease:
			if !n.Fenced() {
				log.Error("no answer from Temporal for longer than the lease: fencing this node (serving no worker)", "lease", lease, "err", err)
				n.Fence(ctx)
			}
			h.Set(Temporal, health.Unhealthy, fmt.Sprintf("no answer from Temporal since %s (lease %s): serving no worker: %v",
				last.UTC().Format(time.RFC3339), lease, err))
		default:
			h.Set(Temporal, health.Degraded, fmt.Sprintf("no answer from Temporal since %s (lease %s): %v", last.UTC().Format(time.RFC3339), lease, err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
