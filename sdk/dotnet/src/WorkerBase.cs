using System;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>
    /// Base class of workers answering each input with a response of one type.
    /// Error responses (<see cref="Error"/>) are ordinary outputs: the event
    /// succeeds and nothing is retried. To fail the event (retry, then dead
    /// letter), throw from <see cref="ProcessAsync"/>.
    /// </summary>
    public abstract class WorkerBase : IWorker
    {
        /// <summary>Appended to the response type for error responses.</summary>
        public const string ErrorSuffix = ".error";

        /// <summary>
        /// A worker whose responses have type responseType (error responses
        /// responseType + ".error") and, when given, source (otherwise the node
        /// fills in workmanager/workers/&lt;worker id&gt;).
        /// </summary>
        protected WorkerBase(string responseType, string source = null)
        {
            if (string.IsNullOrEmpty(responseType))
                throw new ArgumentException("responseType must be a non-empty string", "responseType");
            ResponseType = responseType;
            Source = source;
        }

        /// <summary>The type (topic) of responses.</summary>
        public string ResponseType { get; private set; }

        /// <summary>The source of responses, or null to let the node fill it in.</summary>
        public string Source { get; private set; }

        /// <summary>Handles one event: the output, or null for none.</summary>
        public abstract Task<CloudEvent> ProcessAsync(CloudEvent input);

        /// <summary>
        /// A response to input: type <see cref="ResponseType"/>, a new id,
        /// datacontenttype application/json, the data, <see cref="Source"/> if
        /// set, and the input's correlation id.
        /// </summary>
        protected CloudEvent Response(CloudEvent input, JsonNode data)
        {
            return NewEvent(input, ResponseType, data);
        }

        /// <summary>
        /// An error response to input, an ordinary output: type
        /// <see cref="ResponseType"/> + ".error", data <c>{"error": message,
        /// "input_id": input.Id, "input_type": input.Type}</c>, <see cref="Source"/>
        /// if set, and the input's correlation id.
        /// </summary>
        protected CloudEvent Error(CloudEvent input, string message)
        {
            if (input == null) throw new ArgumentNullException("input");
            var data = new JsonObject
            {
                ["error"] = message,
                ["input_id"] = input.Id,
                ["input_type"] = input.Type,
            };
            return NewEvent(input, ResponseType + ErrorSuffix, data);
        }

        CloudEvent NewEvent(CloudEvent input, string type, JsonNode data)
        {
            if (input == null) throw new ArgumentNullException("input");
            var output = new CloudEvent
            {
                Id = Guid.NewGuid().ToString(),
                Type = type,
                Source = Source,
                DataContentType = "application/json",
                Data = data,
            };
            return output.WithCorrelationId(input);
        }
    }
}
