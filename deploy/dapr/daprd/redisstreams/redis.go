/*
Copyright 2021 The Dapr Authors
Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at
    http://www.apache.org/licenses/LICENSE-2.0
Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package redisstreams is components-contrib v1.14.0's pubsub/redis (Redis
// streams), copied whole, with fourteen changes for WorkManager, each marked
// "WorkManager:" below:
//
//  1. XREADGROUP never blocks forever. Upstream passes readTimeout as BLOCK,
//     and readTimeout defaults to 0 (BLOCK 0, no socket deadline): a closed
//     subscription's read then holds its pooled connection until a message
//     arrives on that stream, one leaked connection per closed streaming
//     subscription, until the pool is exhausted and every publish fails
//     (upstream analysis: components-contrib pull request 4518). Here BLOCK
//     is bounded (blockTimeout, 2s, when readTimeout is unset or not
//     positive), so a cancelled subscription returns its connection
//     within 2s.
//  2. A failing read waits a second before the next one instead of spinning
//     (a stopped Redis made every subscribed topic loop at full speed).
//  3. Publish honours a per-request "maxLenApprox" metadata value, so that
//     each publish can cap its own stream: the nodes and the API send
//     STREAM_MAX_LEN with every publish, the probe and infra topics
//     smaller caps (docs/scaling.md, "Stream length").
//  4. A bounded BLOCK that ends without messages (redis.Nil) is recognised
//     as such: upstream's errors.Is check never matches it, so each idle
//     read was logged as an error and paused by change 2, delaying a message
//     that arrived during the pause by up to a second.
//  5. A structured CloudEvent with data and no datacontenttype is read as
//     application/json (withJSONContentType): daprd 1.14 drops the data of
//     such an event on its way to a gRPC subscriber.
//  6. (and 7.) The redelivery scan is jittered and walks the whole pending
//     list (reclaimPendingMessagesLoop, reclaimPendingMessages).
//  8. A daprd whose app answered nothing for processingTimeout, a message
//     timing out (an app alive but hung: a live node answers every
//     message, RETRY included, within WORKER_TIMEOUT, below it), takes no
//     messages for processingTimeout (stall): it neither reads new ones
//     nor claims pending ones, and hands what it had queued to nobody, so
//     that the other daprds of the consumer group get them; upstream kept
//     handing them to the hung app at every redelivery, a coin toss each
//     time. It does not see a paused (SIGSTOPped) app: daprd's streaming
//     handler then stays blocked sending to it and never reaches the
//     timeout. A version that judged by the age of the messages held
//     stalled healthy daprds in the integration tests; left.
//  9. redeliverInterval given as a duration ("2s") is honoured: upstream
//     ignored it and scanned every 15s (parseRedeliverInterval).
//  10. A message read for a subscription that ended before it reached the
//     app is given back at once (giveBack: its idle time set to
//     processingTimeout), and this daprd's redelivery loops scan at once
//     (the topic's next subscription here takes it), else the next
//     redelivery scan of any daprd hands it out. Upstream left it pending for processingTimeout: the
//     XREADGROUP in flight when a subscription closes (its BLOCK is not
//     interrupted) takes the first message published after, typically the
//     first one a worker started again right away should get, which then
//     waited out the whole processing timeout (45s in deploy/).
//  11. BulkPublish adds a request's entries to its stream in their order,
//     in one round trip and atomically (a Lua script of XADDs): the
//     nodes publish the outputs of a group's calls in fencing-token order
//     in one request, where upstream's default bulk publisher sent each
//     entry on its own goroutine, in any order (FeatureBulkPublish).
//  12. A BulkPublish whose entries carry a fence (metadata fenceLock and
//     fenceToken: the group lock an output was made under and its fencing
//     token) is refused whole when the stream already took an output of
//     that lock with a higher token (fenced: the stale holder's outputs
//     never land after its successor's), checked and recorded in the same
//     script as the XADDs. The lock's check in the node cannot close the
//     gap between a passed check and the publish after it (a node paused
//     there, SIGSTOP or a long GC stop, wakes and publishes late); the
//     broker can. The high-water mark lives beside the stream, in the key
//     "workmanager-fence|<stream>|<lock>", for fenceTTL after its last
//     output; the fence fields are not stored with the entries.
//  13. A fenced BulkPublish may hold the outputs of several locks, each
//     lock's entries consecutive (a run): every run is checked against its
//     own lock's mark and added, or refused, on its own, in one script
//     (bulkXAddRuns); a refused run's entries come back as failed entries
//     whose error starts with WMFENCED, the others are added. A node
//     publishes the outputs of many keys' calls so in one request instead
//     of one each. A request of one run is change 12's.
//  14. A message the app answered RETRY for comes back after retryDelay
//     (1s by default), doubling with each delivery of it, ±50 % at random,
//     instead of after processingTimeout, which remains the longest: its
//     idle time is set so that it is claimable then (a script that does so
//     only while the message is still at the delivery this daprd handed
//     out, so a delivery another daprd claimed since is left alone), and
//     this daprd claims it then itself (the scans of the others take it
//     if it does not). Upstream redelivered every RETRY after
//     processingTimeout (45s and 120s in deploy/): a worker's retry
//     backoff was that long whatever it said, and a slow worker's backlog
//     beyond its queue (given back, RETRY) came back all at once a whole
//     timeout later, the worker idle meanwhile. The doubling keeps a
//     message that is given back again and again (a stuck worker) from
//     coming back more often than about once a timeout for long. At most
//     retryDelayLimit (32) messages of a stream come back so at once; the
//     others wait in line, in order, for a place (retryLine). Only an
//     answer: a delivery that failed or timed out waits processingTimeout,
//     as the app may still be running it.
//
// main.go registers it as "pubsub.redis" in place of the upstream one.
package redisstreams

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rediscomponent "github.com/dapr/components-contrib/common/component/redis"
	contribMetadata "github.com/dapr/components-contrib/metadata"
	"github.com/dapr/components-contrib/pubsub"
	rterrors "github.com/dapr/dapr/pkg/runtime/errors"
	"github.com/dapr/kit/logger"
)

const (
	consumerID        = "consumerID"
	enableTLS         = "enableTLS"
	processingTimeout = "processingTimeout"
	redeliverInterval = "redeliverInterval"
	queueDepth        = "queueDepth"
	concurrency       = "concurrency"
	maxLenApprox      = "maxLenApprox"
	// WorkManager: change 14.
	retryDelay        = "retryDelay"
	defaultRetryDelay = time.Second
	retryDelayLimit   = "retryDelayLimit"
	defaultRetryLimit = 32

	// WorkManager: change 12. The per-entry metadata of a fenced output,
	// the prefix of its high-water mark's key, and how long the mark
	// outlives the lock's last output on the stream: a holder paused
	// between its lock check and its publish for longer than that is no
	// longer refused (the keyed locks' own records expire after an hour).
	fenceLock   = "fenceLock"
	fenceToken  = "fenceToken"
	fencePrefix = "workmanager-fence|"
	fenceTTL    = time.Hour
	// fencedReply starts the error of a refused request.
	fencedReply = "WMFENCED"

	// WorkManager: the BLOCK of XREADGROUP when readTimeout is unset (or not positive).
	blockTimeout = 2 * time.Second
	// WorkManager: the pause after a failed XREADGROUP.
	readErrorBackoff = time.Second
)

// redisStreams handles consuming from a Redis stream using
// `XREADGROUP` for reading new messages and `XPENDING` and
// `XCLAIM` for redelivering messages that previously failed.
//
// See https://redis.io/topics/streams-intro for more information
// on the mechanics of Redis Streams.
type redisStreams struct {
	client         rediscomponent.RedisClient
	clientSettings *rediscomponent.Settings
	logger         logger.Logger
	wg             sync.WaitGroup
	closed         atomic.Bool
	closeCh        chan struct{}

	queue chan redisMessageWrapper

	// WorkManager: change 8. lastAnswer is when the app last answered a
	// message of any stream (unix ns); stalledUntil until when it counts as
	// not answering.
	lastAnswer, stalledUntil atomic.Int64

	// WorkManager: change 10. given[stream] is closed (and forgotten) when
	// messages of stream were given back, waking that stream's redelivery
	// loops on this daprd (its next subscription here takes them at once);
	// only that stream's: waking every topic's loop made each give-back a
	// burst of one XPENDING per topic, which grew the connection pool.
	givenMu sync.Mutex
	given   map[string]chan struct{}

	// WorkManager: change 14. retryDelay is how soon a message answered
	// RETRY is redelivered the first time (0: after processingTimeout);
	// retries[stream] the stream's messages coming back soon, at most
	// retryLimit at once, and the line of the others; queuedRetries the
	// messages in every line (both guarded by givenMu).
	retryDelay    time.Duration
	retryLimit    int
	retries       map[string]*retryLine
	queuedRetries int
}

// givenBack is the channel the next giveBack of stream closes.
func (r *redisStreams) givenBack(stream string) <-chan struct{} {
	r.givenMu.Lock()
	defer r.givenMu.Unlock()
	if r.given == nil {
		r.given = map[string]chan struct{}{}
	}
	ch := r.given[stream]
	if ch == nil {
		ch = make(chan struct{})
		r.given[stream] = ch
	}
	return ch
}

// wakeReclaimers wakes the redelivery loops of stream waiting on givenBack.
func (r *redisStreams) wakeReclaimers(stream string) {
	r.givenMu.Lock()
	defer r.givenMu.Unlock()
	if ch := r.given[stream]; ch != nil {
		close(ch)
		delete(r.given, stream)
	}
}

// redisMessageWrapper encapsulates the message identifier,
// pubsub message, and handler to send to the queue channel for processing.
type redisMessageWrapper struct {
	ctx       context.Context
	messageID string
	message   pubsub.NewMessage
	handler   pubsub.Handler
	// WorkManager: change 14. deliveries is Redis's delivery count of the
	// message with this delivery (1 when it was first read; 0: unknown).
	deliveries int64
}

// NewRedisStreams returns a new redis streams pub-sub implementation.
func NewRedisStreams(logger logger.Logger) pubsub.PubSub {
	return &redisStreams{
		logger:  logger,
		closeCh: make(chan struct{}),
	}
}

func (r *redisStreams) Init(ctx context.Context, metadata pubsub.Metadata) error {
	var err error
	r.client, r.clientSettings, err = rediscomponent.ParseClientFromProperties(metadata.Properties, contribMetadata.PubSubType, ctx, &r.logger)
	if err != nil {
		return err
	}
	// WorkManager: change 9.
	if r.clientSettings.RedeliverInterval, err = parseRedeliverInterval(metadata.Properties, r.clientSettings.RedeliverInterval); err != nil {
		return err
	}
	// WorkManager: change 14.
	if r.retryDelay, err = parseDuration(metadata.Properties, retryDelay, defaultRetryDelay); err != nil {
		return err
	}
	r.retryLimit = defaultRetryLimit
	if v := strings.TrimSpace(metadata.Properties[retryDelayLimit]); v != "" {
		if r.retryLimit, err = strconv.Atoi(v); err != nil || r.retryLimit < 0 {
			return fmt.Errorf("redis streams: %s %q is not a number of messages (0 or more)", retryDelayLimit, v)
		}
	}

	if _, err = r.client.PingResult(ctx); err != nil {
		return fmt.Errorf("redis streams: error connecting to redis at %s: %s", r.clientSettings.Host, err)
	}
	r.queue = make(chan redisMessageWrapper, int(r.clientSettings.QueueDepth))

	for i := uint(0); i < r.clientSettings.Concurrency; i++ {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.worker()
		}()
	}

	return nil
}

func (r *redisStreams) Publish(ctx context.Context, req *pubsub.PublishRequest) error {
	if r.closed.Load() {
		return errors.New("component is closed")
	}

	// WorkManager: change 12. A fenced output goes through the script.
	if _, ok := req.Metadata[fenceLock]; ok {
		res, err := r.BulkPublish(ctx, &pubsub.BulkPublishRequest{PubsubName: req.PubsubName, Topic: req.Topic, Metadata: req.Metadata,
			Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: req.Data, ContentType: ptrOr(req.ContentType), Metadata: req.Metadata}}})
		if err == nil && len(res.FailedEntries) > 0 {
			err = res.FailedEntries[0].Error
		}
		return err
	}

	redisPayload := map[string]interface{}{"data": req.Data}

	if req.Metadata != nil {
		serializedMetadata, err := json.Marshal(req.Metadata)
		if err != nil {
			return err
		}
		redisPayload["metadata"] = serializedMetadata
	}

	maxLen := r.clientSettings.MaxLenApprox
	// WorkManager: a per-request cap (STREAM_MAX_LEN, the probe's, the infra topics').
	if v, ok := req.Metadata[maxLenApprox]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("redis streams: metadata %s=%q is not a non-negative integer", maxLenApprox, v)
		}
		maxLen = n
	}
	_, err := r.client.XAdd(ctx, req.Topic, maxLen, redisPayload)
	if err != nil {
		return fmt.Errorf("redis streams: error from publish: %s", err)
	}

	return nil
}

func (r *redisStreams) CreateConsumerGroup(ctx context.Context, stream string) error {
	err := r.client.XGroupCreateMkStream(ctx, stream, r.clientSettings.ConsumerID, "0")
	// Ignore BUSYGROUP errors
	if err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
		r.logger.Errorf("redis streams: %s", err)
		return err
	}
	return nil
}

func (r *redisStreams) Subscribe(ctx context.Context, req pubsub.SubscribeRequest, handler pubsub.Handler) error {
	if r.closed.Load() {
		return errors.New("component is closed")
	}

	if err := r.CreateConsumerGroup(ctx, req.Topic); err != nil {
		return err
	}

	loopCtx, cancel := context.WithCancel(ctx)
	r.wg.Add(3)
	go func() {
		// Add a context which catches the close signal to account for situations
		// where Close is called, but the context is not cancelled.
		defer r.wg.Done()
		defer cancel()
		select {
		case <-loopCtx.Done():
		case <-r.closeCh:
		}
	}()
	go func() {
		defer r.wg.Done()
		r.pollNewMessagesLoop(loopCtx, req.Topic, handler)
	}()
	go func() {
		defer r.wg.Done()
		r.reclaimPendingMessagesLoop(loopCtx, req.Topic, handler)
	}()

	return nil
}

// enqueueMessages is a shared function that funnels new messages (via polling)
// and redelivered messages (via reclaiming) to a channel where workers can
// pick them up for processing.
//
// WorkManager: deliveries gives each message's delivery count with this
// delivery (change 14; nil: unknown).
func (r *redisStreams) enqueueMessages(ctx context.Context, stream string, handler pubsub.Handler, msgs []rediscomponent.RedisXMessage, deliveries func(id string) int64) {
	for i, msg := range msgs {
		rmsg := r.createRedisMessageWrapper(ctx, stream, handler, msg)
		if deliveries != nil {
			rmsg.deliveries = deliveries(msg.ID)
		}

		select {
		// Might block if the queue is full so we need the ctx.Done below.
		case r.queue <- rmsg:
			// Noop
		// Handle cancelation
		case <-ctx.Done():
			// WorkManager: change 10.
			ids := make([]string, 0, len(msgs)-i)
			for _, m := range msgs[i:] {
				ids = append(ids, m.ID)
			}
			r.giveBack(stream, ids)
			return
		}
	}
}

// giveBack makes messages this daprd read but will not hand to its app
// (their subscription ended) claimable at once (change 10): XCLAIM … IDLE
// sets their idle time to processingTimeout, so the next redelivery scan of
// any daprd of the consumer group (this one's next subscription of the
// topic included) hands them out, instead of after processingTimeout. The
// consumer (one name for every daprd of the app) and the delivery count
// stay as they are (JUSTID). Without redelivery there is nothing to speed up.
func (r *redisStreams) giveBack(stream string, ids []string) {
	if len(ids) == 0 || r.clientSettings.ProcessingTimeout == 0 || r.clientSettings.RedeliverInterval == 0 {
		return
	}
	args := []interface{}{"XCLAIM", stream, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, 0}
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, "IDLE", r.clientSettings.ProcessingTimeout.Milliseconds(), "JUSTID")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.client.DoWrite(ctx, args...); err != nil {
		r.logger.Warnf("redis streams: messages %v of %s not given back (they are redelivered after processingTimeout): %v", ids, stream, err)
		return
	}
	r.logger.Debugf("redis streams: %d messages of %s given back: their subscription ended", len(ids), stream)
	r.wakeReclaimers(stream)
}

// createRedisMessageWrapper encapsulates the Redis message, message identifier, and handler
// in `redisMessage` for processing.
func (r *redisStreams) createRedisMessageWrapper(ctx context.Context, stream string, handler pubsub.Handler, msg rediscomponent.RedisXMessage) redisMessageWrapper {
	var data []byte
	if dataValue, exists := msg.Values["data"]; exists && dataValue != nil {
		switch v := dataValue.(type) {
		case string:
			data = []byte(v)
		case []byte:
			data = v
		}
	}

	data = withJSONContentType(data)

	var metadata map[string]string
	if metadataValue, exists := msg.Values["metadata"]; exists && metadataValue != nil {
		metadataStr := metadataValue.(string)
		err := json.Unmarshal([]byte(metadataStr), &metadata)
		if err != nil {
			r.logger.Warnf("Redis PubSub: Could not extract metadata for Redis message %s: %v", msg.ID, err)
		}
	}

	return redisMessageWrapper{
		ctx: ctx,
		message: pubsub.NewMessage{
			Topic:    stream,
			Data:     data,
			Metadata: metadata,
		},
		messageID: msg.ID,
		handler:   handler,
	}
}

// worker runs in separate goroutine(s) and pull messages from a channel for processing.
// The number of workers is controlled by the `concurrency` setting.
func (r *redisStreams) worker() {
	for {
		select {
		// Handle closing
		case <-r.closeCh:
			return

		case msg := <-r.queue:
			r.processMessage(msg)
		}
	}
}

// processMessage attempts to process a single Redis message by invoking
// its handler. If the message processed successfully, then it is Ack'ed.
// Otherwise, it remains in the pending list and will be redelivered
// by `reclaimPendingMessagesLoop`.
func (r *redisStreams) processMessage(msg redisMessageWrapper) error {
	r.logger.Debugf("Processing Redis message %s", msg.messageID)
	ctx := msg.ctx
	var cancel context.CancelFunc
	if r.clientSettings.ProcessingTimeout != 0 && r.clientSettings.RedeliverInterval != 0 {
		ctx, cancel = context.WithTimeout(ctx, r.clientSettings.ProcessingTimeout)
		defer cancel()
	}
	// WorkManager: what was queued while the app stopped answering goes to
	// the other daprds (it stays pending and is claimed after its
	// processing timeout), not to the app that does not answer.
	if r.appStalled() {
		return errors.New("the app is not answering: left for another subscriber")
	}
	// WorkManager: change 10: its subscription ended while it was queued.
	if msg.ctx.Err() != nil {
		r.giveBack(msg.message.Topic, []string{msg.messageID})
		return fmt.Errorf("the subscription to %s ended: message %s given back", msg.message.Topic, msg.messageID)
	}
	err := msg.handler(ctx, &msg.message)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && msg.ctx.Err() == nil {
		r.noAnswer(msg.message.Topic)
	} else {
		r.answered()
	}
	if err != nil {
		r.logger.Errorf("Error processing Redis message %s: %v", msg.messageID, err)
		// WorkManager: change 14.
		if answeredRetry(err) && ctx.Err() == nil {
			r.retrySoon(msg)
		}

		return err
	}

	// Use the background context in case subscriptionCtx is already closed.
	if err := r.client.XAck(context.Background(), msg.message.Topic, r.clientSettings.ConsumerID, msg.messageID); err != nil {
		r.logger.Errorf("Error acknowledging Redis message %s: %v", msg.messageID, err)

		return err
	}

	return nil
}

// pollMessagesLoop calls `XReadGroup` for new messages and funnels them to the message channel
// by calling `enqueueMessages`.
func (r *redisStreams) pollNewMessagesLoop(ctx context.Context, stream string, handler pubsub.Handler) {
	// WorkManager: never BLOCK 0 (see the package comment).
	block := time.Duration(r.clientSettings.ReadTimeout)
	if block <= 0 {
		block = blockTimeout
	}
	for {
		// Return on cancelation
		if ctx.Err() != nil {
			return
		}
		// WorkManager: no new messages for an app that does not answer.
		if r.appStalled() {
			select {
			case <-time.After(stallPoll):
			case <-ctx.Done():
				return
			}
			continue
		}

		// Read messages
		streams, err := r.client.XReadGroupResult(ctx, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, []string{stream, ">"}, int64(r.clientSettings.QueueDepth), block)
		if err != nil {
			// WorkManager: a BLOCK that ends without messages returns redis.Nil,
			// whose type differs from GetNilValueError's (errors.Is never
			// matched: upstream only ever blocked forever, so it never saw it).
			// Compare the text, so that an idle stream is neither logged as
			// an error nor paused by readErrorBackoff.
			if err.Error() != r.client.GetNilValueError().Error() && !errors.Is(err, r.client.GetNilValueError()) && err != context.Canceled {
				if strings.Contains(err.Error(), "NOGROUP") {
					r.logger.Warnf("redis streams: consumer group %s does not exist for stream %s. This could mean the server experienced data loss, or the group/stream was deleted.", r.clientSettings.ConsumerID, stream)
					r.logger.Warnf("redis streams: recreating group %s for stream %s", r.clientSettings.ConsumerID, stream)
					r.CreateConsumerGroup(ctx, stream)
				}
				r.logger.Errorf("redis streams: error reading from stream %s: %s", stream, err)
				// WorkManager: do not spin while Redis is away.
				select {
				case <-time.After(readErrorBackoff):
				case <-ctx.Done():
					return
				}
			}
			continue
		}

		// Enqueue messages for the returned streams
		for _, s := range streams {
			r.enqueueMessages(ctx, s.Stream, handler, s.Messages, firstDelivery)
		}
	}
}

// reclaimPendingMessagesLoop periodically reclaims pending messages
// based on the `redeliverInterval` setting.
func (r *redisStreams) reclaimPendingMessagesLoop(ctx context.Context, stream string, handler pubsub.Handler) {
	// Having a `processingTimeout` or `redeliverInterval` means that
	// redelivery is disabled so we just return out of the goroutine.
	if r.clientSettings.ProcessingTimeout == 0 || r.clientSettings.RedeliverInterval == 0 {
		return
	}

	// WorkManager: change 10: the give-back channel is taken before each
	// scan, so a give-back that comes during the scan, or between the
	// scan and the wait, wakes the next one (a channel taken after the
	// scan missed it: the message waited for the next timed scan).
	given := r.givenBack(stream)

	// Do an initial reclaim call
	r.reclaimPendingMessages(ctx, stream, handler)

	// WorkManager: each pause is the interval ±50 % at random, not a fixed
	// ticker. Every daprd of the consumer group scans the pending list; the
	// first whose scan comes after a message's processing timeout gets it.
	// With fixed tickers the daprd whose phase comes first got nearly every
	// redelivery, also the messages its node had just given back (a worker
	// it cannot run): they bounced to it again and again.
	reclaimTimer := time.NewTimer(jittered(r.clientSettings.RedeliverInterval))
	defer reclaimTimer.Stop()

	for {
		select {
		case <-ctx.Done():
			return

		case <-reclaimTimer.C:
			r.reclaimPendingMessages(ctx, stream, handler)
			reclaimTimer.Reset(jittered(r.clientSettings.RedeliverInterval))

		// WorkManager: change 10: messages of this topic were given back
		// (a closed subscription's).
		case <-given:
			given = r.givenBack(stream)
			r.reclaimPendingMessages(ctx, stream, handler)
		}
	}
}

// parseRedeliverInterval is the component's redeliverInterval (change 9):
// upstream's settings skip the key when decoding (mapstructure:"-") and
// then read it as a number of milliseconds only, so a duration such as
// "2s" — what the manifests here, and Dapr's own docs, write — was
// silently replaced by the 15s default. A number is milliseconds, as
// upstream; a duration is parsed; anything else is an error naming it.
func parseRedeliverInterval(props map[string]string, parsed time.Duration) (time.Duration, error) {
	return parseDuration(props, redeliverInterval, parsed)
}

// parseDuration reads the duration property key as parseRedeliverInterval
// reads redeliverInterval (a number of milliseconds or a duration such as
// "1s"); def when it is absent.
func parseDuration(props map[string]string, key string, def time.Duration) (time.Duration, error) {
	v := strings.TrimSpace(props[key])
	if v == "" {
		return def, nil
	}
	if ms, err := strconv.ParseUint(v, 10, 64); err == nil {
		return time.Duration(ms) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("redis streams: %s %q is neither a number of milliseconds nor a duration such as 1s", key, v)
	}
	return d, nil
}

// firstDelivery is the delivery count of a message read for the first time.
func firstDelivery(string) int64 { return 1 }

// answeredRetry reports whether err is daprd's for an app that answered a
// message RETRY (or with a status it does not know, which it retries the
// same): a retriable error with no cause. A delivery that failed (the
// stream to the app broken: a retriable error with its cause) or timed
// out is not an answer; the app may still be running it (change 14).
func answeredRetry(err error) bool {
	var re *rterrors.RetriableError
	return errors.As(err, &re) && re.Unwrap() == nil
}

// retryAfter is how soon a message answered RETRY at its deliveries-th
// delivery comes back (change 14): its doubled delay (retryDoubled), ±50 %
// at random; false when there is none or the drawn one is not below
// processingTimeout, which then applies as upstream.
func (r *redisStreams) retryAfter(deliveries int64) (time.Duration, bool) {
	d, ok := r.retryDoubled(deliveries)
	if !ok {
		return 0, false
	}
	d = jittered(d)
	return d, d < r.clientSettings.ProcessingTimeout
}

// retryDoubled is retryDelay doubled for each delivery before the
// deliveries-th; false when that is not below processingTimeout (or
// either is off, or retryDelayLimit is 0).
func (r *redisStreams) retryDoubled(deliveries int64) (time.Duration, bool) {
	pt := r.clientSettings.ProcessingTimeout
	if r.retryDelay <= 0 || r.retryLimit == 0 || deliveries < 1 || pt == 0 || r.clientSettings.RedeliverInterval == 0 {
		return 0, false
	}
	d := r.retryDelay
	for i := int64(1); i < deliveries && d < pt; i++ {
		d *= 2
	}
	return d, d < pt
}

// retryEntry is a message answered RETRY that is to come back soon
// (change 14): what claiming it for its subscription here needs.
type retryEntry struct {
	ctx        context.Context
	handler    pubsub.Handler
	stream, id string
	deliveries int64
}

// retryLine is a stream's messages coming back soon (change 14): at most
// retryLimit have their idle time set and a claim scheduled (soon); the
// others answered RETRY meanwhile wait in line, in order, and take the
// place of the next one claimed. A worker that gives back all it gets
// (hung, or far slower than its input) so has at most retryLimit messages
// coming back at any time, each taking one of daprd's concurrency slots
// for as long as the node holds it (up to WORKER_QUEUE_WAIT): without the
// limit its messages, coming back again and again, took the slots the
// topic's other workers needed (TestHungWorkerDoesNotDelayOthers: the
// other worker's p99 2.6 s); without the line, those beyond the limit
// waited processingTimeout and a slow worker's backlog came in waves
// again. A message in line whose processingTimeout passes first is taken
// by any daprd's scan as before (its turn then finds it claimed and is
// skipped).
type retryLine struct {
	soon   int
	queued []retryEntry
}

// idleMargin is how much sooner than its claim here a message coming back
// soon is claimable by anyone (change 14).
const idleMargin = 10 * time.Millisecond

// maxQueuedRetries bounds the messages in line over all streams, and
// maxQueuedPerStream those of one, so that the failing messages of one
// topic do not fill every topic's line (ids and a context, not their
// data; the ones beyond wait processingTimeout).
const (
	maxQueuedRetries   = 16384
	maxQueuedPerStream = 1024
)

// retryLater sets a message's idle time to processingTimeout less
// ARGV[5] ms, so that it is claimable after that long, when it is still
// pending at delivery count ARGV[4] (nobody claimed it since this daprd
// handed it out); KEYS[1] the stream, ARGV[1] the group, ARGV[2] the
// consumer, ARGV[3] its id. 1 when set, 0 when left alone (change 14).
const retryLater = `
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or tonumber(p[1][4]) ~= tonumber(ARGV[4]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[5], 'JUSTID')
return 1`

// retrySoon makes msg, answered RETRY, come back after retryAfter instead
// of processingTimeout (change 14): at once when fewer than retryLimit
// messages of its stream are coming back, else when its turn in line
// comes.
func (r *redisStreams) retrySoon(msg redisMessageWrapper) {
	if _, ok := r.retryDoubled(msg.deliveries); !ok {
		return
	}
	e := retryEntry{ctx: msg.ctx, handler: msg.handler, stream: msg.message.Topic, id: msg.messageID, deliveries: msg.deliveries}
	r.givenMu.Lock()
	if r.retries == nil {
		r.retries = map[string]*retryLine{}
	}
	l := r.retries[e.stream]
	if l == nil {
		l = &retryLine{}
		r.retries[e.stream] = l
	}
	if l.soon >= r.retryLimit {
		if r.queuedRetries < maxQueuedRetries && len(l.queued) < maxQueuedPerStream {
			l.queued = append(l.queued, e)
			r.queuedRetries++
		}
		r.givenMu.Unlock()
		return
	}
	l.soon++
	r.givenMu.Unlock()
	r.scheduleRetry(e)
}

// scheduleRetry sets e's idle time so that it is claimable after
// retryAfter and claims it for its subscription here then; when that
// cannot be (claimed by another daprd since, acknowledged, Redis away),
// the next in line takes its place.
func (r *redisStreams) scheduleRetry(e retryEntry) {
	for {
		if d, ok := r.markRetry(e); ok {
			time.AfterFunc(d, func() {
				if next, ok := r.nextRetry(e.stream); ok {
					go r.scheduleRetry(next)
				}
				if e.ctx.Err() != nil || r.closed.Load() {
					return
				}
				r.claimAndEnqueue(e.ctx, e.stream, e.handler, []string{e.id}, map[string]int64{e.id: e.deliveries})
			})
			return
		}
		next, ok := r.nextRetry(e.stream)
		if !ok {
			return
		}
		e = next
	}
}

// markRetry runs retryLater for e: how long until it is claimable, false
// when it was left alone.
func (r *redisStreams) markRetry(e retryEntry) (time.Duration, bool) {
	d, ok := r.retryAfter(e.deliveries)
	if !ok || e.ctx.Err() != nil || r.closed.Load() {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Claimable a little before the claim here (idleMargin): Redis counts
	// idle time in whole milliseconds, and the claim must find it due.
	idle := min(r.clientSettings.ProcessingTimeout-d+idleMargin, r.clientSettings.ProcessingTimeout)
	set, evalErr, err := r.client.EvalInt(ctx, retryLater, []string{e.stream},
		r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, e.id, e.deliveries, idle.Milliseconds())
	if err == nil {
		err = evalErr
	}
	if err != nil {
		r.logger.Warnf("redis streams: message %s of %s is redelivered after processingTimeout, not in %s: %v", e.id, e.stream, d, err)
		return 0, false
	}
	return d, set != nil && *set == 1
}

// nextRetry hands the place of a message of stream that came back (or
// could not be scheduled) to the next one in line whose subscription is
// still open, or frees it.
func (r *redisStreams) nextRetry(stream string) (retryEntry, bool) {
	r.givenMu.Lock()
	defer r.givenMu.Unlock()
	l := r.retries[stream]
	if l == nil {
		return retryEntry{}, false
	}
	for len(l.queued) > 0 {
		e := l.queued[0]
		l.queued[0] = retryEntry{}
		l.queued = l.queued[1:]
		r.queuedRetries--
		if e.ctx.Err() == nil {
			return e, true
		}
	}
	l.queued = nil
	if l.soon--; l.soon <= 0 {
		delete(r.retries, stream)
	}
	return retryEntry{}, false
}

// stallPoll is how often a stalled stream's reader looks whether the stall
// ended (change 8).
const stallPoll = 250 * time.Millisecond

// appStalled reports whether the app counts as not answering (change 8).
func (r *redisStreams) appStalled() bool {
	return time.Now().UnixNano() < r.stalledUntil.Load()
}

// answered records an answer of the app (success or error, but not
// processingTimeout's end): it ends a stall.
func (r *redisStreams) answered() {
	r.lastAnswer.Store(time.Now().UnixNano())
	r.stalledUntil.Store(0)
}

// noAnswer records that the app did not answer a message of stream within
// the processing timeout. When it answered nothing else for as long (a
// paused or hung app, not one slow message of a busy one), it gets no
// message for one more processing timeout (change 8).
func (r *redisStreams) noAnswer(stream string) {
	now := time.Now()
	if now.Sub(time.Unix(0, r.lastAnswer.Load())) < r.clientSettings.ProcessingTimeout {
		return
	}
	if !r.appStalled() {
		r.logger.Warnf("redis streams: the app answered no message for processingTimeout (%s; the last one of %s): the stream's messages go to the other subscribers for as long", r.clientSettings.ProcessingTimeout, stream)
	}
	r.stalledUntil.Store(now.Add(r.clientSettings.ProcessingTimeout).UnixNano())
}

// jittered is d ±50 %, uniformly at random.
func jittered(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

// reclaimPendingMessages handles reclaiming messages that previously failed to process and
// funneling them to the message channel by calling `enqueueMessages`.
//
// WorkManager: it walks the whole pending list a page (queueDepth entries)
// at a time. Upstream reads only the first page, from "-", again and again:
// while queueDepth older entries are in flight or were just claimed (a
// backlog behind a group lock), a failed message further down the list was
// never redelivered, for minutes (found by the chaos soak, issue 25).
func (r *redisStreams) reclaimPendingMessages(ctx context.Context, stream string, handler pubsub.Handler) {
	if r.appStalled() {
		return // WorkManager: change 8
	}
	start := "-"
	for {
		// Retrieve pending messages for this stream and consumer
		pendingResult, err := r.client.XPendingExtResult(ctx,
			stream,
			r.clientSettings.ConsumerID,
			start,
			"+",
			int64(r.clientSettings.QueueDepth),
		)
		if err != nil && !errors.Is(err, r.client.GetNilValueError()) {
			r.logger.Errorf("error retrieving pending Redis messages: %v", err)

			break
		}
		if len(pendingResult) == 0 {
			break
		}

		// Filter out messages that have not timed out yet
		msgIDs := make([]string, 0, len(pendingResult))
		var counts map[string]int64 // WorkManager: change 14
		for _, msg := range pendingResult {
			if msg.Idle >= r.clientSettings.ProcessingTimeout {
				msgIDs = append(msgIDs, msg.ID)
				if counts == nil {
					counts = make(map[string]int64, len(pendingResult))
				}
				counts[msg.ID] = msg.RetryCount
			}
		}

		if len(msgIDs) > 0 {
			r.claimAndEnqueue(ctx, stream, handler, msgIDs, counts)
		}
		if ctx.Err() != nil || len(pendingResult) < int(r.clientSettings.QueueDepth) {
			break
		}
		// The next page: entries after the last one of this page ("(" is
		// an exclusive start, Redis 6.2 and later).
		start = "(" + pendingResult[len(pendingResult)-1].ID
	}
}

// claimAndEnqueue claims the pending messages msgIDs that are still idle
// for the processing timeout (another daprd may have claimed them since)
// and enqueues them.
//
// WorkManager: counts gives their delivery counts before the claim, which
// adds one (change 14; an id missing: unknown).
func (r *redisStreams) claimAndEnqueue(ctx context.Context, stream string, handler pubsub.Handler, msgIDs []string, counts map[string]int64) {
	// Attempt to claim the messages for the filtered IDs
	claimResult, err := r.client.XClaimResult(ctx,
		stream,
		r.clientSettings.ConsumerID,
		r.clientSettings.ConsumerID,
		r.clientSettings.ProcessingTimeout,
		msgIDs,
	)
	if err != nil && !errors.Is(err, r.client.GetNilValueError()) {
		r.logger.Errorf("error claiming pending Redis messages: %v", err)

		return
	}

	// Enqueue claimed messages
	r.enqueueMessages(ctx, stream, handler, claimResult, func(id string) int64 {
		if n, ok := counts[id]; ok {
			return n + 1
		}
		return 0
	})

	// If the Redis nil error is returned, it means somes message in the pending
	// state no longer exist. We need to acknowledge these messages to
	// remove them from the pending list.
	if errors.Is(err, r.client.GetNilValueError()) {
		// Build a set of message IDs that were not returned
		// that potentially no longer exist.
		expectedMsgIDs := make(map[string]struct{}, len(msgIDs))
		for _, id := range msgIDs {
			expectedMsgIDs[id] = struct{}{}
		}
		for _, claimed := range claimResult {
			delete(expectedMsgIDs, claimed.ID)
		}

		r.removeMessagesThatNoLongerExistFromPending(ctx, stream, expectedMsgIDs, handler)
	}
}

// removeMessagesThatNoLongerExistFromPending attempts to claim messages individually so that messages in the pending list
// that no longer exist can be removed from the pending list. This is done by calling `XACK`.
func (r *redisStreams) removeMessagesThatNoLongerExistFromPending(ctx context.Context, stream string, messageIDs map[string]struct{}, handler pubsub.Handler) {
	// Check each message ID individually.
	for pendingID := range messageIDs {
		claimResultSingleMsg, err := r.client.XClaimResult(ctx,
			stream,
			r.clientSettings.ConsumerID,
			r.clientSettings.ConsumerID,
			0,
			[]string{pendingID},
		)
		if err != nil && !errors.Is(err, r.client.GetNilValueError()) {
			r.logger.Errorf("error claiming pending Redis message %s: %v", pendingID, err)

			continue
		}

		// Ack the message to remove it from the pending list.
		if errors.Is(err, r.client.GetNilValueError()) {
			// Use the background context in case subscriptionCtx is already closed.
			if err = r.client.XAck(context.Background(), stream, r.clientSettings.ConsumerID, pendingID); err != nil {
				r.logger.Errorf("error acknowledging Redis message %s after failed claim for %s: %v", pendingID, stream, err)
			}
		} else {
			// This should not happen but if it does the message should be processed.
			r.enqueueMessages(ctx, stream, handler, claimResultSingleMsg, nil)
		}
	}
}

func (r *redisStreams) Close() error {
	defer r.wg.Wait()
	if r.closed.CompareAndSwap(false, true) {
		close(r.closeCh)
	}

	if r.client == nil {
		return nil
	}
	return r.client.Close()
}

func (r *redisStreams) Features() []pubsub.Feature {
	return []pubsub.Feature{pubsub.FeatureBulkPublish}
}

// luaFns are the scripts' shared functions: below compares two fencing
// tokens as decimal strings, shorter first (Lua's numbers are doubles);
// xadd adds one entry, its data and its metadata ("" for none, written as
// Publish writes it: no metadata field), to stream, capped at about cap
// entries (0: none).
const luaFns = `
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function xadd(stream, cap, data, meta)
  local args = {'XADD', stream}
  if cap > 0 then
    table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, cap)
  end
  table.insert(args, '*'); table.insert(args, 'data'); table.insert(args, data)
  if meta ~= '' then
    table.insert(args, 'metadata'); table.insert(args, meta)
  end
  redis.call(unpack(args))
end
`

// bulkXAdd adds ARGV's entries to the stream KEYS[1] in their order, in
// one atomic step: ARGV[1] is the approximate cap (0: none); ARGV[2] and
// ARGV[3] the lowest and highest fencing token of the entries and ARGV[4]
// the mark's TTL in ms when KEYS[2], the high-water mark of their lock on
// this stream, is given (change 12: refused, nothing added, when the mark
// is above the lowest token; else set to the highest, which is then at
// least the mark: fenceOf checks that the tokens are in order); then per
// entry its data and its metadata.
const bulkXAdd = luaFns + `
if KEYS[2] then
  local mark = redis.call('GET', KEYS[2])
  if mark and below(ARGV[2], mark) then
    return redis.error_reply('` + fencedReply + ` token ' .. ARGV[2] .. ' of ' .. KEYS[2] .. ' is below ' .. mark .. ', already published')
  end
end
local cap = tonumber(ARGV[1])
local n = 0
for i = 5, #ARGV, 2 do
  xadd(KEYS[1], cap, ARGV[i], ARGV[i + 1])
  n = n + 1
end
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return n`

// bulkXAddRuns is bulkXAdd for a request of several runs (change 13):
// KEYS[1] the stream, KEYS[1+g] the high-water mark of run g's lock;
// ARGV[1] the approximate cap (0: none), ARGV[2] the marks' TTL in ms,
// ARGV[3] the number of runs, then per run its lowest and highest token
// and its number of entries, then per entry its data and metadata. Runs
// are taken in order, each checked against its mark as it stands then
// (a lock may have several runs); a refused run adds nothing. It returns
// the refused runs as a bit mask (run g: 2^(g-1); at most maxFenceRuns
// runs, so the mask stays exact in a double).
const bulkXAddRuns = luaFns + `
local cap = tonumber(ARGV[1])
local runs = tonumber(ARGV[3])
local e = 4 + 3 * runs
local refused, bit = 0, 1
for g = 1, runs do
  local low, high, n = ARGV[1 + 3 * g], ARGV[2 + 3 * g], tonumber(ARGV[3 + 3 * g])
  local mark = redis.call('GET', KEYS[1 + g])
  if mark and below(low, mark) then
    refused = refused + bit
  else
    for i = e, e + 2 * (n - 1), 2 do
      xadd(KEYS[1], cap, ARGV[i], ARGV[i + 1])
    end
    redis.call('SET', KEYS[1 + g], high, 'PX', ARGV[2])
  end
  e = e + 2 * n
  bit = bit * 2
end
return refused`

// maxFenceRuns bounds the runs of one request (change 13).
const maxFenceRuns = 48

// BulkPublish implements pubsub.BulkPublisher (change 11): every entry of
// req, in order, in one script (nothing else writes to the stream between
// them); on an error every entry is reported failed, though those before
// the failing XADD stay added (Redis does not roll a script back): a
// retry may add them twice, never out of order. The stream's
// cap is the first entry's maxLenApprox (else the request's, else the
// component's), as Publish reads it. Entries with a fence (change 12)
// come in runs of one lock, tokens in order within a run; a request of
// several runs (change 13) reports a refused run's entries as failed
// entries, without an error for the request.
func (r *redisStreams) BulkPublish(ctx context.Context, req *pubsub.BulkPublishRequest) (pubsub.BulkPublishResponse, error) {
	failAll := func(err error) (pubsub.BulkPublishResponse, error) {
		res := pubsub.BulkPublishResponse{FailedEntries: make([]pubsub.BulkPublishResponseFailedEntry, len(req.Entries))}
		for i, e := range req.Entries {
			res.FailedEntries[i] = pubsub.BulkPublishResponseFailedEntry{EntryId: e.EntryId, Error: err}
		}
		return res, err
	}
	if r.closed.Load() {
		return failAll(errors.New("component is closed"))
	}
	if len(req.Entries) == 0 {
		return pubsub.BulkPublishResponse{}, nil
	}
	maxLen := r.clientSettings.MaxLenApprox
	capOf := req.Metadata
	if m := req.Entries[0].Metadata; m != nil {
		capOf = m
	}
	if v, ok := capOf[maxLenApprox]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return failAll(fmt.Errorf("redis streams: metadata %s=%q is not a non-negative integer", maxLenApprox, v))
		}
		maxLen = n
	}
	keys, runs, err := fenceOf(req)
	if err != nil {
		return failAll(err)
	}
	args := make([]any, 0, 3+3*len(runs)+2*len(req.Entries))
	if len(runs) > 1 {
		args = append(args, maxLen, fenceTTL.Milliseconds(), len(runs))
		for _, ru := range runs {
			args = append(args, ru.low, ru.high, ru.n)
		}
	} else {
		var f run
		if len(runs) == 1 {
			f = runs[0]
		}
		args = append(args, maxLen, f.low, f.high, fenceTTL.Milliseconds())
	}
	for _, e := range req.Entries {
		meta := ""
		if m := withoutFence(e.Metadata); m != nil {
			b, err := json.Marshal(m)
			if err != nil {
				return failAll(err)
			}
			meta = string(b)
		}
		args = append(args, e.Event, meta)
	}
	if len(runs) > 1 {
		mask, evalErr, err := r.client.EvalInt(ctx, bulkXAddRuns, keys, args...)
		if err == nil {
			err = evalErr
		}
		if err == nil && mask == nil {
			err = errors.New("no answer")
		}
		if err != nil {
			return failAll(fmt.Errorf("redis streams: error from bulk publish: %s", err))
		}
		var res pubsub.BulkPublishResponse
		at := 0
		for g, ru := range runs {
			if *mask&(1<<g) != 0 {
				err := fmt.Errorf("%s token %s of %s is below the lock's mark on %s, already published", fencedReply, ru.low, ru.lock, req.Topic)
				for _, e := range req.Entries[at : at+ru.n] {
					res.FailedEntries = append(res.FailedEntries, pubsub.BulkPublishResponseFailedEntry{EntryId: e.EntryId, Error: err})
				}
			}
			at += ru.n
		}
		return res, nil
	}
	n, evalErr, err := r.client.EvalInt(ctx, bulkXAdd, keys, args...)
	if err == nil {
		err = evalErr
	}
	if err == nil && (n == nil || *n != len(req.Entries)) {
		err = fmt.Errorf("added %v of %d entries", n, len(req.Entries))
	}
	if err != nil {
		return failAll(fmt.Errorf("redis streams: error from bulk publish: %s", err))
	}
	return pubsub.BulkPublishResponse{}, nil
}

func ptrOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// run is one lock's consecutive entries of a fenced request (changes 12
// and 13): the lock, its entries' lowest and highest token, their number.
type run struct {
	lock, low, high string
	n               int
}

// fenceOf returns the script's keys for req (its stream, then the
// high-water mark of each run's lock) and its runs (none when no entry
// carries a fence). Either every entry carries a fence or none does; a
// run's tokens are decimal and in order.
func fenceOf(req *pubsub.BulkPublishRequest) ([]string, []run, error) {
	keys := []string{req.Topic}
	_, fencedReq := req.Entries[0].Metadata[fenceLock]
	var runs []run
	var last int64
	for i, e := range req.Entries {
		lock, ok := e.Metadata[fenceLock]
		switch {
		case ok != fencedReq:
			return nil, nil, errors.New("redis streams: some entries of the request carry a fence and some do not")
		case !ok:
			continue
		case lock == "":
			return nil, nil, fmt.Errorf("redis streams: entry %d: metadata %s is empty", i, fenceLock)
		}
		v := e.Metadata[fenceToken]
		tok, err := strconv.ParseInt(v, 10, 64)
		if err != nil || tok < 0 || strconv.FormatInt(tok, 10) != v {
			return nil, nil, fmt.Errorf("redis streams: entry %d: metadata %s=%q is not a non-negative decimal integer", i, fenceToken, v)
		}
		if len(runs) > 0 && runs[len(runs)-1].lock == lock {
			ru := &runs[len(runs)-1]
			if tok < last {
				return nil, nil, fmt.Errorf("redis streams: entry %d: fencing token %d after %d of lock %q: a run's tokens must be in order", i, tok, last, lock)
			}
			ru.high, ru.n, last = v, ru.n+1, tok
			continue
		}
		if len(runs) == maxFenceRuns {
			return nil, nil, fmt.Errorf("redis streams: more than %d runs of fenced entries in one request", maxFenceRuns)
		}
		runs = append(runs, run{lock: lock, low: v, high: v, n: 1})
		keys = append(keys, fencePrefix+req.Topic+"|"+lock)
		last = tok
	}
	return keys, runs, nil
}

// withoutFence is m without the fence fields (not stored with an entry).
func withoutFence(m map[string]string) map[string]string {
	_, a := m[fenceLock]
	_, b := m[fenceToken]
	if !a && !b {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k != fenceLock && k != fenceToken {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (r *redisStreams) Ping(ctx context.Context) error {
	if _, err := r.client.PingResult(ctx); err != nil {
		return fmt.Errorf("redis pubsub: error connecting to redis at %s: %s", r.clientSettings.Host, err)
	}

	return nil
}

func (r *redisStreams) GetComponentMetadata() (metadataInfo contribMetadata.MetadataMap) {
	metadataStruct := rediscomponent.Settings{}
	contribMetadata.GetMetadataInfoFromStructType(reflect.TypeOf(metadataStruct), &metadataInfo, contribMetadata.PubSubType)
	return
}

// WorkManager: withJSONContentType gives a structured CloudEvent that
// carries data but no datacontenttype the type "application/json", which
// is what CloudEvents' JSON format implies. daprd 1.14 hands such an
// event's data to a gRPC subscriber only when its datacontenttype says
// text or JSON, and drops it otherwise
// (pkg/runtime/pubsub/subscriptions.go, GRPCEnvelopeFromSubscriptionMessage):
// the worker got the event with no data, silently. Anything else (raw
// payloads, data_base64, an explicit datacontenttype) is left as it is;
// the common case costs two byte searches.
func withJSONContentType(data []byte) []byte {
	if bytes.Contains(data, []byte(`"datacontenttype"`)) || !bytes.Contains(data, []byte(`"data"`)) {
		return data
	}
	var ce map[string]json.RawMessage
	if json.Unmarshal(data, &ce) != nil {
		return data
	}
	if _, ok := ce["specversion"]; !ok {
		return data
	}
	if d, ok := ce["data"]; !ok || string(d) == "null" {
		return data
	}
	ce["datacontenttype"] = json.RawMessage(`"application/json"`)
	out, err := json.Marshal(ce)
	if err != nil {
		return data
	}
	return out
}
