using System.Globalization;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>A <see cref="WorkerBase"/> with an <see cref="ApiClient"/> for gateway calls.</summary>
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
        }

        /// <summary>The gateway client.</summary>
        protected ApiClient Api { get; private set; }
    }

    /// <summary>
    /// A <see cref="CommandWorker{T}"/> with an <see cref="ApiClient"/>. Before the
    /// handler runs, <c>api_host</c> / <c>api_port</c> of the payload (when
    /// present) set <see cref="ApiClient.Host"/> / <see cref="ApiClient.Port"/>;
    /// invalid values are error responses ("Invalid 'api_port' field: &lt;value as
    /// JSON&gt;"). They do not change routing: the node routes by service name.
    /// </summary>
    public abstract class ApiCommandWorker<T> : CommandWorker<T> where T : struct
    {
        /// <summary>
        /// A command worker answering with responseType; api null: a client using
        /// <see cref="HostServices.Gateway"/>.
        /// </summary>
        protected ApiCommandWorker(string responseType, string source = null, ApiClient api = null)
            : base(responseType, source)
        {
            Api = api ?? new ApiClient();
        }

        /// <summary>The gateway client.</summary>
        protected ApiClient Api { get; private set; }

        internal override string Prepare(CloudEvent input, T command, JsonObject payload)
        {
            var host = payload["api_host"];
            if (host != null)
            {
                string text;
                if (!(host is JsonValue) || !host.AsValue().TryGetValue(out text) || text.Length == 0)
                    return "Invalid 'api_host' field: " + host.ToJsonString();
                Api.Host = text;
            }
            var port = payload["api_port"];
            if (port != null)
            {
                int number;
                if (!TryPort(port, out number)) return "Invalid 'api_port' field: " + port.ToJsonString();
                Api.Port = number;
            }
            return null;
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
