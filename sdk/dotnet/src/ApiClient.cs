using System;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>
    /// Calls backend services through the node's gateway: inside the WorkManager
    /// host through <see cref="HostServices.Gateway"/>, elsewhere (unit tests,
    /// tools) through an injected gateway function. Calls run synchronously on
    /// the calling thread; the returned tasks are complete. Failures are
    /// <see cref="GatewayException"/>s (in the task).
    /// </summary>
    public sealed class ApiClient
    {
        /// <summary>The default <see cref="Host"/>.</summary>
        public const string DefaultHost = "localhost";
        /// <summary>The default <see cref="Port"/>.</summary>
        public const int DefaultPort = 5002;

        static readonly UTF8Encoding Utf8 = new UTF8Encoding(false);

        readonly Func<string, string, byte[], byte[]> gateway;
        string host = DefaultHost;
        int port = DefaultPort;

        /// <summary>
        /// A client calling gateway <c>(service, method, body) =&gt; response</c>;
        /// null uses <see cref="HostServices.Gateway"/> at call time.
        /// </summary>
        public ApiClient(Func<string, string, byte[], byte[]> gateway = null)
        {
            this.gateway = gateway;
        }

        /// <summary>
        /// The host hint (api_host of a command payload; "localhost" by default).
        /// Recorded only: the node routes every call by its service name.
        /// </summary>
        public string Host
        {
            get { return host; }
            set
            {
                if (string.IsNullOrEmpty(value)) throw new ArgumentException("api_host must be a non-empty string", "value");
                host = value;
            }
        }

        /// <summary>
        /// The port hint (api_port of a command payload; 5002 by default), 1-65535.
        /// Recorded only: the node routes every call by its service name.
        /// </summary>
        public int Port
        {
            get { return port; }
            set
            {
                if (value < 1 || value > 65535) throw new ArgumentOutOfRangeException("value", value, "api_port must be a port number (1-65535)");
                port = value;
            }
        }

        /// <summary>"host:port", the target hint (it does not change routing).</summary>
        public string Target { get { return host + ":" + port; } }

        /// <summary>
        /// Calls method of service with body (null: empty) and returns the
        /// response body. Fails with <see cref="GatewayException"/>.
        /// </summary>
        public Task<byte[]> CallRawAsync(string service, string method, byte[] body)
        {
            var done = new TaskCompletionSource<byte[]>();
            try
            {
                done.SetResult(CallRaw(service, method, body));
            }
            catch (GatewayException e)
            {
                done.SetException(e);
            }
            return done.Task;
        }

        byte[] CallRaw(string service, string method, byte[] body)
        {
            if (string.IsNullOrEmpty(service) || string.IsNullOrEmpty(method))
                throw new GatewayException("service and method must be non-empty strings");
            var call = gateway ?? HostServices.Gateway;
            if (call == null)
                throw new GatewayException("no gateway: not running inside the WorkManager host and none injected");
            byte[] answer;
            try
            {
                answer = call(service, method, body ?? new byte[0]);
            }
            catch (GatewayException)
            {
                throw;
            }
            catch (Exception e)
            {
                while (e is AggregateException && e.InnerException != null) e = e.InnerException;
                throw new GatewayException(service + "/" + method + ": " + e.Message, e);
            }
            return answer ?? new byte[0];
        }

        /// <summary>
        /// Calls method of service with payload as compact JSON (null: empty body)
        /// and returns the response parsed as JSON, or as a string
        /// <see cref="JsonValue"/> when it is not JSON. Fails with
        /// <see cref="GatewayException"/>.
        /// </summary>
        public async Task<JsonNode> CallAsync(string service, string method, JsonNode payload)
        {
            byte[] body = payload == null ? new byte[0] : Utf8.GetBytes(payload.ToJsonString());
            var answer = await CallRawAsync(service, method, body).ConfigureAwait(false);
            return Decode(answer);
        }

        static JsonNode Decode(byte[] body)
        {
            string text = Utf8.GetString(body);
            try
            {
                return JsonNode.Parse(text);
            }
            catch (JsonException)
            {
                return JsonValue.Create(text);
            }
        }
    }
}
