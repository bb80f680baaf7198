package api

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Limits of CreateWorker's max_concurrency and max_processes.
const (
	MaxWorkerConcurrency = 256
	MaxWorkerProcesses   = 16
)

// workerConcurrency validates CreateWorker's max_concurrency and
// max_processes and returns what the worker's record keeps (0: unset, the
// cluster's default).
func workerConcurrency(req *pb.CreateWorkerRequest) (maxConcurrency, maxProcesses int, err error) {
	if req.MaxConcurrency != nil {
		if c := req.GetMaxConcurrency(); c < 1 || c > MaxWorkerConcurrency {
			return 0, 0, status.Errorf(codes.InvalidArgument, "max_concurrency %d must be 1..%d; unset: the cluster's PYTHON_MAX_CONCURRENCY", c, MaxWorkerConcurrency)
		}
		maxConcurrency = int(req.GetMaxConcurrency())
	}
	if req.MaxProcesses != nil {
		if p := req.GetMaxProcesses(); p < 1 || p > MaxWorkerProcesses {
			return 0, 0, status.Errorf(codes.InvalidArgument, "max_processes %d must be 1..%d; unset: the cluster's PYTHON_MAX_PROCESSES or DOTNET_MAX_PROCESSES", p, MaxWorkerProcesses)
		}
		maxProcesses = int(req.GetMaxProcesses())
	}
	return maxConcurrency, maxProcesses, nil
}

// MaxWorkerTimeout bounds CreateWorker's timeout_ms (each node caps it
// again at its WORKER_TIMEOUT).
const MaxWorkerTimeout = time.Hour

// workerTimeout validates CreateWorker's timeout_ms and returns what the
// worker's record keeps (0: unset, the node's WORKER_TIMEOUT).
func workerTimeout(req *pb.CreateWorkerRequest) (int64, error) {
	if req.TimeoutMs == nil {
		return 0, nil
	}
	if ms := req.GetTimeoutMs(); ms < 1 || ms > MaxWorkerTimeout.Milliseconds() {
		return 0, status.Errorf(codes.InvalidArgument, "timeout_ms %d must be 1..%d (capped by each node's WORKER_TIMEOUT); unset: WORKER_TIMEOUT", ms, MaxWorkerTimeout.Milliseconds())
	}
	return req.GetTimeoutMs(), nil
}

// optionalInt64 is n as an optional proto field (nil for 0: unset).
func optionalInt64(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}

// optionalInt32 is n as an optional proto field (nil for 0: unset).
func optionalInt32(n int) *int32 {
	if n == 0 {
		return nil
	}
	v := int32(n)
	return &v
}
