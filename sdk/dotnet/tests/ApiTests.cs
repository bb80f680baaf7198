using System;
using System.Collections.Generic;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Tests
{
    /// <summary>A recording gateway stub: answers from a table of "service/method" keys.</summary>
    sealed class StubGateway
    {
        public readonly List<string> Calls = new List<string>();
        public readonly Dictionary<string, string> Answers = new Dictionary<string, string>();

        public byte[] Call(string service, string method, byte[] body)
        {
            Calls.Add(service + "/" + method + " " + Encoding.UTF8.GetString(body));
            string answer;
            if (!Answers.TryGetValue(service + "/" + method, out answer))
                throw new KeyNotFoundException("no stub for " + service + "/" + method);
            return answer == null ? null : Encoding.UTF8.GetBytes(answer);
        }
    }

    public enum QuoteCommand { Quote, Ping }

    sealed class Quotes : ApiCommandWorker<QuoteCommand>
    {
        public Quotes(ApiClient api = null) : base("quotes.response", null, api) { }

        public ApiClient Client { get { return Api; } }

        protected override async Task<CloudEvent> HandleAsync(CloudEvent input, QuoteCommand command, JsonNode payload)
        {
            switch (command)
            {
                case QuoteCommand.Quote:
                    try
                    {
                        var quote = await Api.CallAsync("pricing", "quote", new JsonObject { ["symbol"] = payload["symbol"].DeepClone() });
                        return Response(input, quote);
                    }
                    catch (GatewayException e)
                    {
                        return Error(input, "pricing unavailable: " + e.Message);
                    }
                case QuoteCommand.Ping:
                    return Response(input, new JsonObject { ["target"] = Api.Target, ["pong"] = await Api.CallAsync("health", "ping", null) });
                default:
                    throw new ArgumentOutOfRangeException("command", command, "unhandled command");
            }
        }
    }

    sealed class Enricher : ApiWorker
    {
        public Enricher(ApiClient api = null) : base("orders.enriched", "urn:enricher", api) { }

        public ApiClient Client { get { return Api; } }

        public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            var customer = await Api.CallAsync("crm", "customer", input.Data);
            return Response(input, new JsonObject { ["order"] = input.Data.DeepClone(), ["customer"] = customer });
        }
    }

    static class ApiTests
    {
        const string NoGateway = "no gateway: not running inside the WorkManager host and none injected";

        static CloudEvent Command(JsonObject data)
        {
            return new CloudEvent { Id = "q1", Type = "quotes", Data = data };
        }

        static string Text(byte[] body) { return Encoding.UTF8.GetString(body); }

        [Test]
        static async Task CallRawWithInjectedGateway()
        {
            var stub = new StubGateway();
            stub.Answers["svc/m"] = "raw answer";
            var api = new ApiClient(stub.Call);
            Assert.Equal("raw answer", Text(await api.CallRawAsync("svc", "m", Encoding.UTF8.GetBytes("body"))));
            Assert.Equal("raw answer", Text(await api.CallRawAsync("svc", "m", null)));
            Assert.SequenceEqual(new[] { "svc/m body", "svc/m " }, stub.Calls, "a null body is sent empty");
            stub.Answers["svc/nil"] = null;
            Assert.Equal(0, (await api.CallRawAsync("svc", "nil", new byte[0])).Length, "a null answer is empty");
        }

        [Test]
        static async Task CallDecodesJson()
        {
            var stub = new StubGateway();
            stub.Answers["pricing/quote"] = "{\"price\":3.25,\"currency\":\"EUR\"}";
            stub.Answers["pricing/text"] = "plain text";
            stub.Answers["pricing/empty"] = "";
            stub.Answers["pricing/null"] = "null";
            stub.Answers["pricing/number"] = " 42 ";
            var api = new ApiClient(stub.Call);
            Assert.Json("{\"price\":3.25,\"currency\":\"EUR\"}", await api.CallAsync("pricing", "quote", new JsonObject { ["symbol"] = "ACME", ["n"] = 1 }));
            Assert.Equal("pricing/quote {\"symbol\":\"ACME\",\"n\":1}", stub.Calls[0], "compact JSON payload");
            var text = await api.CallAsync("pricing", "text", JsonValue.Create("s"));
            Assert.Equal("plain text", text.GetValue<string>(), "non-JSON answers are strings");
            Assert.Equal("pricing/text \"s\"", stub.Calls[1], "a string payload is sent as JSON");
            Assert.Equal("", (await api.CallAsync("pricing", "empty", null)).GetValue<string>(), "an empty answer is an empty string");
            Assert.Equal("pricing/empty ", stub.Calls[2], "a null payload is an empty body");
            Assert.Null(await api.CallAsync("pricing", "null", null), "JSON null");
            Assert.Equal(42, (await api.CallAsync("pricing", "number", null)).GetValue<int>());
        }

        [Test]
        static async Task HostServicesGateway()
        {
            var saved = HostServices.Gateway;
            try
            {
                var api = new ApiClient();
                HostServices.Gateway = null;
                var e = await Assert.ThrowsAsync<GatewayException>(() => api.CallAsync("s", "m", null));
                Assert.Equal(NoGateway, e.Message);
                var host = new StubGateway();
                host.Answers["s/m"] = "{\"from\":\"host\"}";
                HostServices.Gateway = host.Call; // read at call time
                Assert.Json("{\"from\":\"host\"}", await api.CallAsync("s", "m", 1));
                Assert.SequenceEqual(new[] { "s/m 1" }, host.Calls);
                var injected = new StubGateway();
                injected.Answers["s/m"] = "\"injected\"";
                Assert.Json("\"injected\"", await new ApiClient(injected.Call).CallAsync("s", "m", null), "an injected gateway wins");
                Assert.Equal(1, host.Calls.Count);
            }
            finally
            {
                HostServices.Gateway = saved;
            }
        }

        [Test]
        static async Task NoGatewayAtAll()
        {
            var saved = HostServices.Gateway;
            try
            {
                HostServices.Gateway = null;
                var task = new ApiClient().CallRawAsync("s", "m", null);
                Assert.True(task.IsFaulted, "the failure is in the task");
                var e = await Assert.ThrowsAsync<GatewayException>(() => task);
                Assert.Equal(NoGateway, e.Message);
            }
            finally
            {
                HostServices.Gateway = saved;
            }
        }

        [Test]
        static async Task FailingGateway()
        {
            var stub = new StubGateway();
            var api = new ApiClient(stub.Call);
            var wrapped = await Assert.ThrowsAsync<GatewayException>(() => api.CallAsync("pricing", "quote", null));
            Assert.Equal("pricing/quote: no stub for pricing/quote", wrapped.Message);
            Assert.True(wrapped.InnerException is KeyNotFoundException, "the cause is kept");
            var original = new GatewayException("refused by policy");
            var passed = await Assert.ThrowsAsync<GatewayException>(() => new ApiClient((s, m, b) => { throw original; }).CallRawAsync("a", "b", null));
            Assert.True(ReferenceEquals(original, passed), "a GatewayException passes as it is");
            var empty = await Assert.ThrowsAsync<GatewayException>(() => api.CallRawAsync("", "m", null));
            Assert.Equal("service and method must be non-empty strings", empty.Message);
            await Assert.ThrowsAsync<GatewayException>(() => api.CallAsync("s", null, null));
            Assert.Equal(0, stub.Calls.Count - 1, "only the first call reached the gateway");
        }

        [Test]
        static void HostAndPort()
        {
            var api = new ApiClient();
            Assert.Equal("localhost", api.Host);
            Assert.Equal(5002, api.Port);
            Assert.Equal("localhost:5002", api.Target);
            api.Host = "pricing.internal";
            api.Port = 8080;
            Assert.Equal("pricing.internal:8080", api.Target);
            Assert.Throws<ArgumentException>(() => api.Host = "");
            Assert.Throws<ArgumentOutOfRangeException>(() => api.Port = 0);
            Assert.Throws<ArgumentOutOfRangeException>(() => api.Port = 65536);
            Assert.Equal("pricing.internal:8080", api.Target);
        }

        [Test]
        static async Task ApiWorkerCallsTheGateway()
        {
            var stub = new StubGateway();
            stub.Answers["crm/customer"] = "{\"name\":\"Ada\"}";
            var worker = new Enricher(new ApiClient(stub.Call));
            var input = new CloudEvent { Id = "o1", Type = "orders", Data = new JsonObject { ["customer"] = 5 } };
            input["correlationid"] = "c";
            var output = await worker.ProcessAsync(input);
            Assert.Equal("orders.enriched", output.Type);
            Assert.Equal("urn:enricher", output.Source);
            Assert.Equal((object)"c", output["correlationid"]);
            Assert.Json("{\"order\":{\"customer\":5},\"customer\":{\"name\":\"Ada\"}}", output.Data);
            Assert.SequenceEqual(new[] { "crm/customer {\"customer\":5}" }, stub.Calls);
            Assert.NotNull(new Enricher().Client, "a default client");
        }

        [Test]
        static async Task ApiWorkerFailsTheEventOnGatewayErrors()
        {
            var worker = new Enricher(new ApiClient(new StubGateway().Call));
            await Assert.ThrowsAsync<GatewayException>(() => worker.ProcessAsync(new CloudEvent { Id = "o", Type = "orders", Data = 1 }));
        }

        [Test]
        static async Task ApiCommandWorkerCalls()
        {
            var stub = new StubGateway();
            stub.Answers["pricing/quote"] = "{\"price\":3}";
            var worker = new Quotes(new ApiClient(stub.Call));
            var output = await worker.ProcessAsync(Command(new JsonObject { ["command"] = "quote", ["symbol"] = "ACME" }));
            Assert.Equal("quotes.response", output.Type);
            Assert.Json("{\"price\":3}", output.Data);
            Assert.SequenceEqual(new[] { "pricing/quote {\"symbol\":\"ACME\"}" }, stub.Calls);
            var failed = await new Quotes(new ApiClient(new StubGateway().Call)).ProcessAsync(Command(new JsonObject { ["command"] = "quote", ["symbol"] = "X" }));
            Assert.Json("{\"error\":\"pricing unavailable: pricing/quote: no stub for pricing/quote\",\"input_id\":\"q1\",\"input_type\":\"quotes\"}", failed.Data);
            var uncaught = await new Quotes(new ApiClient(new StubGateway().Call)).ProcessAsync(Command(new JsonObject { ["command"] = "ping" }));
            Assert.Json("{\"error\":\"Internal error: GatewayException: health/ping: no stub for health/ping\",\"input_id\":\"q1\",\"input_type\":\"quotes\"}", uncaught.Data);
        }

        [Test]
        static async Task ApiHostAndPortFromPayload()
        {
            var stub = new StubGateway();
            stub.Answers["health/ping"] = "\"pong\"";
            var worker = new Quotes(new ApiClient(stub.Call));
            var output = await worker.ProcessAsync(Command(new JsonObject { ["command"] = "ping", ["api_host"] = "backend", ["api_port"] = 8080 }));
            Assert.Json("{\"target\":\"backend:8080\",\"pong\":\"pong\"}", output.Data);
            Assert.Equal("localhost:5002", worker.Client.Target, "the command re-pointed the client for its handler only");
            output = await worker.ProcessAsync(Command(new JsonObject { ["command"] = "ping", ["api_host"] = "backend" }));
            Assert.Json("{\"target\":\"backend:5002\",\"pong\":\"pong\"}", output.Data, "api_host alone: the default port 5002");
            output = await worker.ProcessAsync(Command(new JsonObject { ["command"] = "ping", ["api_port"] = "9090" }));
            Assert.Json("{\"target\":\"localhost:9090\",\"pong\":\"pong\"}", output.Data, "a port as a decimal string; the configured host");
            output = await worker.ProcessAsync(Command(new JsonObject { ["command"] = "ping", ["api_host"] = null, ["api_port"] = null }));
            Assert.Json("{\"target\":\"localhost:5002\",\"pong\":\"pong\"}", output.Data, "null fields: the configured client");
            Assert.Equal(4, stub.Calls.Count, "every call went through the gateway");
            Assert.Equal("localhost:5002", worker.Client.Target);
        }

        [Test]
        static async Task ApiInvalidHostAndPort()
        {
            var cases = new[]
            {
                new[] { "api_port", "\"abc\"", "Invalid 'api_port' field: \"abc\"" },
                new[] { "api_port", "70000", "Invalid 'api_port' field: 70000" },
                new[] { "api_port", "0", "Invalid 'api_port' field: 0" },
                new[] { "api_port", "-1", "Invalid 'api_port' field: -1" },
                new[] { "api_port", "80.5", "Invalid 'api_port' field: 80.5" },
                new[] { "api_port", "true", "Invalid 'api_port' field: true" },
                new[] { "api_port", "\"-80\"", "Invalid 'api_port' field: \"-80\"" },
                new[] { "api_port", "\"\"", "Invalid 'api_port' field: \"\"" },
                new[] { "api_port", "[80]", "Invalid 'api_port' field: [80]" },
                new[] { "api_host", "\"\"", "Invalid 'api_host' field: \"\"" },
                new[] { "api_host", "5", "Invalid 'api_host' field: 5" },
                new[] { "api_host", "{\"h\":1}", "Invalid 'api_host' field: {\"h\":1}" },
            };
            foreach (var c in cases)
            {
                var stub = new StubGateway();
                var worker = new Quotes(new ApiClient(stub.Call));
                var data = new JsonObject { ["command"] = "ping", [c[0]] = JsonNode.Parse(c[1]) };
                var output = await worker.ProcessAsync(Command(data));
                Assert.Equal("quotes.response.error", output.Type, c[1]);
                Assert.Json(new JsonObject { ["error"] = c[2], ["input_id"] = "q1", ["input_type"] = "quotes" }.ToJsonString(), output.Data);
                Assert.Equal(0, stub.Calls.Count, "the handler did not run");
                Assert.Equal("localhost:5002", worker.Client.Target, "nothing changed");
            }
        }

        [Test]
        static async Task ApiCommandErrorsStillApply()
        {
            var worker = new Quotes(new ApiClient(new StubGateway().Call));
            var output = await worker.ProcessAsync(Command(new JsonObject { ["api_port"] = "bad" }));
            Assert.Equal("Missing 'command' field", output.Data["error"].GetValue<string>(), "the command is checked first");
        }
    }
}
