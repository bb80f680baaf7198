using System;
using System.Globalization;
using System.Threading;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>
    /// A <see cref="WorkerBase"/> with an <see cref="ApiClient"/> for gateway calls.
    /// Override <see cref="ProcessAsync(CloudEvent, ApiClient)"/> (the original
    /// DevKit's shape: the client is passed in) or <see cref="ProcessAsync(CloudEvent)"/>
    /// (and use <see cref="Api"/>); a class overriding neither fails to construct.
    /// </summary>
    public abstract class ApiWorker : WorkerBase
    {
        /// <summary>
        /// A worker answering with responseType; api null: a client using
        /// <see cref="HostServices.Gateway"/> (pass one with an injected gateway to test).
        /// </summary>
        protected ApiWorker(string responseType, string source = null, ApiClient api = null)
            : base(responseType, source)
        {
            Api = api ?? new ApiClient();
            CheckOverride();
        }

        /// <summary>
        /// The original DevKit's constructor: a worker whose <see cref="ApiClient"/>
        /// points at apiHost:apiPort, answering with responseEventType from source
        /// (null: the node fills it in).
        /// </summary>
        protected ApiWorker(string apiHost, int apiPort, string responseEventType, string source = null)
            : base(responseEventType, source)
        {
            Api = new ApiClient(apiHost, apiPort);
            CheckOverride();
        }

        /// <summary>The gateway client.</summary>
        protected ApiClient Api { get; private set; }

        /// <summary>Calls <see cref="ProcessAsync(CloudEvent, ApiClient)"/> with <see cref="Api"/>.</summary>
        public override Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            return ProcessAsync(input, Api);
        }

        /// <summary>
        /// Handles one event with the worker's client: the output, or null for
        /// none. Throwing fails the event.
        /// </summary>
        public virtual Task<CloudEvent> ProcessAsync(CloudEvent input, ApiClient api)
        {
            throw new NotSupportedException(GetType().FullName + " overrides neither ProcessAsync(CloudEvent) nor ProcessAsync(CloudEvent, ApiClient)");
        }

        void CheckOverride()
        {
            var type = GetType();
            var one = type.GetMethod("ProcessAsync", new[] { typeof(CloudEvent) });
            var two = type.GetMethod("ProcessAsync", new[] { typeof(CloudEvent), typeof(ApiClient) });
            if (one.DeclaringType == typeof(ApiWorker) && two.DeclaringType == typeof(ApiWorker))
                throw new NotSupportedException(type.FullName + " overrides neither ProcessAsync(CloudEvent) nor ProcessAsync(CloudEvent, ApiClient)");
        }
    }

    /// <summary>
    /// A <see cref="CommandWorker{T}"/> with an <see cref="ApiClient"/>. A command
    /// whose payload has <c>api_host</c> and/or <c>api_port</c> re-points the
    /// client for that command: <see cref="Api"/> is, during its handler, a client
    /// at api_host (else the configured host) and api_port (else 5002 when
    /// api_host is given, the configured port otherwise); other commands use the
    /// configured client. Invalid values are error responses ("Invalid
    /// 'api_port' field: &lt;value as JSON&gt;"). The node is the gateway: it
    /// routes every call by its service name.
    /// </summary>
    public abstract class ApiCommandWorker<T> : CommandWorker<T> where T : struct
    {
        readonly ApiTarget target;

        /// <summary>
        /// A command worker answering with responseType; api null: a client using
        /// <see cref="HostServices.Gateway"/>.
        /// </summary>
        protected ApiCommandWorker(string responseType, string source = null, ApiClient api = null)
            : base(responseType, source)
        {
            target = new ApiTarget(api ?? new ApiClient());
        }

        /// <summary>
        /// The original DevKit's constructor: a command worker whose configured
        /// client points at apiHost:apiPort, answering with responseEventType.
        /// </summary>
        protected ApiCommandWorker(string apiHost, int apiPort, string responseEventType, string source = null)
            : base(responseEventType, source)
        {
            target = new ApiTarget(new ApiClient(apiHost, apiPort));
        }

        /// <summary>The gateway client: during a handler, the one the command points at.</summary>
        protected ApiClient Api { get { return target.Current; } }

        internal override string Prepare(CloudEvent input, T command, JsonObject payload)
        {
            return target.Repoint(payload);
        }

        internal override void Finish()
        {
            target.Reset();
        }
    }

    /// <summary>
    /// A <see cref="CommandWorker"/> (commands as strings) with an
    /// <see cref="ApiClient"/>, re-pointed by <c>api_host</c>/<c>api_port</c> as
    /// in <see cref="ApiCommandWorker{T}"/>.
    /// </summary>
    public abstract class ApiCommandWorker : CommandWorker
    {
        readonly ApiTarget target;

        /// <summary>A command worker answering with responseType; api null: a client using <see cref="HostServices.Gateway"/>.</summary>
        protected ApiCommandWorker(string responseType, string source = null, ApiClient api = null)
            : base(responseType, source)
        {
            target = new ApiTarget(api ?? new ApiClient());
        }

        /// <summary>The original DevKit's constructor: the configured client points at apiHost:apiPort.</summary>
        protected ApiCommandWorker(string apiHost, int apiPort, string responseEventType, string source = null)
            : base(responseEventType, source)
        {
            target = new ApiTarget(new ApiClient(apiHost, apiPort));
        }

        /// <summary>The gateway client: during a handler, the one the command points at.</summary>
        protected ApiClient Api { get { return target.Current; } }

        internal override string Prepare(CloudEvent input, string command, JsonObject payload)
        {
            return target.Repoint(payload);
        }

        internal override void Finish()
        {
            target.Reset();
        }
    }

    /// <summary>A configured client and the one the current command points at.</summary>
    sealed class ApiTarget
    {
        readonly ApiClient configured;
        readonly AsyncLocal<ApiClient> current = new AsyncLocal<ApiClient>();

        internal ApiTarget(ApiClient configured)
        {
            this.configured = configured;
        }

        internal ApiClient Current { get { return current.Value ?? configured; } }

        /// <summary>Points <see cref="Current"/> at payload's api_host/api_port; an error message, or null.</summary>
        internal string Repoint(JsonObject payload)
        {
            var host = payload["api_host"];
            var port = payload["api_port"];
            if (host == null && port == null) return null;
            string text = configured.Host;
            if (host != null && (!(host is JsonValue) || !host.AsValue().TryGetValue(out text) || text.Length == 0))
                return "Invalid 'api_host' field: " + host.ToJsonString();
            int number = host != null ? ApiClient.DefaultPort : configured.Port;
            if (port != null && !TryPort(port, out number))
                return "Invalid 'api_port' field: " + port.ToJsonString();
            current.Value = configured.At(text, number);
            return null;
        }

        internal void Reset()
        {
            current.Value = null;
        }

        static bool TryPort(JsonNode node, out int number)
        {
            number = 0;
            var value = node as JsonValue;
            if (value == null) return false;
            string text;
            if (value.TryGetValue(out text))
            {
                if (!int.TryParse(text, NumberStyles.None, CultureInfo.InvariantCulture, out number)) return false;
            }
            else if (!value.TryGetValue(out number)) return false;
            return number >= 1 && number <= 65535;
        }
    }
}
