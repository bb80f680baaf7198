using System;
using System.Collections;
using System.Dynamic;
using System.Globalization;
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
        /// A client at host:port (the original DevKit's <c>new ApiClient(host, port)</c>)
        /// calling gateway (null: <see cref="HostServices.Gateway"/> at call time).
        /// </summary>
        public ApiClient(string host, int port, Func<string, string, byte[], byte[]> gateway = null)
            : this(gateway)
        {
            Host = host;
            Port = port;
        }

        /// <summary>A client at host:port with this client's gateway.</summary>
        internal ApiClient At(string host, int port)
        {
            return new ApiClient(host, port, gateway);
        }

        /// <summary>
        /// The gateway as a <c>dynamic</c> object, as in the original DevKit:
        /// <c>dynamic gateway = Api.Gateway; var answer = await gateway.pricing.quote(request);</c>
        /// calls method <c>quote</c> of service <c>pricing</c> through this client
        /// (<c>gateway["order-service"]</c> for names that are not identifiers). See
        /// <see cref="ServiceClient"/> for requests and answers. Referencing
        /// Microsoft.CSharp is needed to use it (the node's compiler does).
        /// </summary>
        public dynamic Gateway { get { return new ApiGateway(this); } }

        /// <summary>The client of one service (as <c>Gateway.&lt;service&gt;</c> returns).</summary>
        public ServiceClient Service(string service)
        {
            return new ServiceClient(this, service);
        }

        /// <summary>
        /// The API host (api_host of a command payload re-points it for that
        /// command; "localhost" by default). The node is the gateway: it routes
        /// every call by its service name, whatever the host.
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
        /// The API port, 1-65535 (api_port of a command payload re-points it for
        /// that command; 5002 by default). The node routes by service name.
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

        /// <summary>"host:port", where this client points (the node routes by service name).</summary>
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
    /// <summary>
    /// <see cref="ApiClient.Gateway"/>: a dynamic object whose members (and
    /// string indexes) are <see cref="ServiceClient"/>s of the services they name.
    /// </summary>
    public sealed class ApiGateway : DynamicObject
    {
        readonly ApiClient client;

        /// <summary>The gateway of client.</summary>
        public ApiGateway(ApiClient client)
        {
            if (client == null) throw new ArgumentNullException("client");
            this.client = client;
        }

        /// <summary><c>gateway.pricing</c>: the client of service "pricing".</summary>
        public override bool TryGetMember(GetMemberBinder binder, out object result)
        {
            result = client.Service(binder.Name);
            return true;
        }

        /// <summary><c>gateway["order-service"]</c>: the client of that service.</summary>
        public override bool TryGetIndex(GetIndexBinder binder, object[] indexes, out object result)
        {
            var name = indexes.Length == 1 ? indexes[0] as string : null;
            if (name == null) throw new ArgumentException("index the gateway with one service name (a string)");
            result = client.Service(name);
            return true;
        }
    }

    /// <summary>
    /// The client of one service, dynamic: <c>service.quote(request)</c> calls
    /// method "quote" with request and returns a task of the answer. request is
    /// a <see cref="JsonNode"/>, a string, number or bool (a JSON value), a
    /// dictionary with string keys or a list (converted to JSON, nested values
    /// too), nothing or null (an empty body): the task's result is the answer
    /// as a <see cref="JsonNode"/> (a string value when it is not JSON).
    /// A byte[] request is sent as it is and the result is the raw answer
    /// (byte[]). Failures are <see cref="GatewayException"/>s in the task.
    /// </summary>
    public sealed class ServiceClient : DynamicObject
    {
        readonly ApiClient client;

        /// <summary>The client of service through client.</summary>
        public ServiceClient(ApiClient client, string service)
        {
            if (client == null) throw new ArgumentNullException("client");
            if (string.IsNullOrEmpty(service)) throw new ArgumentException("service must be a non-empty string", "service");
            this.client = client;
            Name = service;
        }

        /// <summary>The service's name (a Dapr app id or HTTPEndpoint name).</summary>
        public string Name { get; private set; }

        /// <summary>Calls method with request (see the class): the answer as JSON.</summary>
        public Task<JsonNode> CallAsync(string method, object request = null)
        {
            return client.CallAsync(Name, method, ToJson(request, "request"));
        }

        /// <summary><c>service.method(request)</c>: <see cref="CallAsync"/>, or the raw call for a byte[].</summary>
        public override bool TryInvokeMember(InvokeMemberBinder binder, object[] args, out object result)
        {
            if (args.Length > 1)
                throw new ArgumentException(Name + "." + binder.Name + ": a gateway call takes one request, not " + args.Length);
            var request = args.Length == 1 ? args[0] : null;
            var raw = request as byte[];
            if (raw != null)
                result = client.CallRawAsync(Name, binder.Name, raw);
            else
                result = CallAsync(binder.Name, request);
            return true;
        }

        static JsonNode ToJson(object value, string path)
        {
            if (value == null) return null;
            var node = value as JsonNode;
            if (node != null) return node;
            var s = value as string;
            if (s != null) return JsonValue.Create(s);
            if (value is bool) return JsonValue.Create((bool)value);
            if (value is int || value is short || value is byte || value is sbyte || value is ushort)
                return JsonValue.Create(Convert.ToInt32(value, CultureInfo.InvariantCulture));
            if (value is long || value is uint) return JsonValue.Create(Convert.ToInt64(value, CultureInfo.InvariantCulture));
            if (value is double || value is float) return JsonValue.Create(Convert.ToDouble(value, CultureInfo.InvariantCulture));
            if (value is decimal || value is ulong) return JsonValue.Create(Convert.ToDecimal(value, CultureInfo.InvariantCulture));
            var dict = value as IDictionary;
            if (dict != null)
            {
                var o = new JsonObject();
                foreach (DictionaryEntry entry in dict)
                {
                    var key = entry.Key as string;
                    if (key == null) throw new ArgumentException(path + ": a dictionary key is not a string");
                    var child = ToJson(entry.Value, path + "." + key);
                    o[key] = child;
                }
                return o;
            }
            var list = value as IEnumerable;
            if (list != null)
            {
                var a = new JsonArray();
                var i = 0;
                foreach (var item in list)
                {
                    a.Add(ToJson(item, path + "[" + i.ToString(CultureInfo.InvariantCulture) + "]"));
                    i++;
                }
                return a;
            }
            throw new ArgumentException(path + ": a " + value.GetType().Name +
                " is not a gateway request; pass a JsonNode, a dictionary, a list, a string, a number, a bool or a byte[]");
        }
    }
}
