// Workers written as the original DevKit's specification shows them
// (namespace Virtufin.Worker.DevKit only): each shape, run directly.
using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;
using Assert = Virtufin.Worker.Tests.Assert;
using StubGateway = Virtufin.Worker.Tests.StubGateway;
using TestAttribute = Virtufin.Worker.Tests.TestAttribute;

namespace Seed.Workers
{
    // ApiWorker(apiHost, apiPort, responseEventType, source) and ProcessAsync(CloudEvent, ApiClient).
    public sealed class Pricer : ApiWorker
    {
        public Pricer() : base("pricing-api", 5002, "order.priced", "urn:pricer") { }

        public override async Task<CloudEvent> ProcessAsync(CloudEvent input, ApiClient api)
        {
            dynamic gateway = api.Gateway;
            var quote = await gateway.pricing.quote(new JsonObject { ["sku"] = input.Data["sku"].DeepClone() });
            return Response(input, new JsonObject { ["price"] = ((JsonNode)quote)["price"].DeepClone(), ["via"] = api.Target });
        }
    }

    public sealed class Neither : ApiWorker
    {
        public Neither() : base("h", 1, "t", null) { }
    }

    // The non-generic CommandWorker: HandleCommandAsync(input, command, node).
    public sealed class Greeter : CommandWorker
    {
        public Greeter() : base("greeting", "urn:greeter") { }

        protected override ICollection<string> Commands { get { return new[] { "hello" }; } }

        protected override Task<CloudEvent> HandleCommandAsync(CloudEvent input, string command, JsonNode node)
        {
            return Task.FromResult(Response(input, new JsonObject { ["said"] = command, ["to"] = node["name"].DeepClone() }));
        }
    }

    public enum WebSocketManagerCommand { create, delete }

    // CommandWorker<T> where T : struct, Enum: HandleAsync(input, T, node).
    public sealed class Sockets : CommandWorker<WebSocketManagerCommand>
    {
        public Sockets() : base("sockets.response", "urn:sockets") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, WebSocketManagerCommand command, JsonNode node)
        {
            switch (command)
            {
                case WebSocketManagerCommand.create: return Task.FromResult(Response(input, "created"));
                case WebSocketManagerCommand.delete: return Task.FromResult(Error(input, "cannot delete"));
                default: throw new ArgumentOutOfRangeException("command");
            }
        }
    }

    // ApiCommandWorker<T>: the Api property, re-pointed by api_host/api_port.
    public sealed class Quotes : ApiCommandWorker<WebSocketManagerCommand>
    {
        public Quotes() : base("api.internal", 6000, "quotes.response", null) { }

        protected override async Task<CloudEvent> HandleAsync(CloudEvent input, WebSocketManagerCommand command, JsonNode node)
        {
            dynamic gateway = Api.Gateway;
            JsonNode answer = await gateway["order-service"].create(node["order"]);
            return Response(input, new JsonObject { ["target"] = Api.Target, ["answer"] = answer });
        }
    }

    // The non-generic ApiCommandWorker: (apiHost, apiPort, ...) and the client during HandleCommandAsync.
    public sealed class Lookup : ApiCommandWorker
    {
        public Lookup() : base("api.internal", 6000, "lookup.response", null) { }

        protected override async Task<CloudEvent> HandleCommandAsync(CloudEvent input, string command, JsonNode node)
        {
            var answer = await Api.Service("directory").CallAsync(command, node["who"]);
            return Response(input, new JsonObject { ["target"] = Api.Target, ["answer"] = answer });
        }
    }

    public struct NotAnEnum { }

    public sealed class BadCommands : ApiCommandWorker<NotAnEnum>
    {
        public BadCommands() : base("x") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, NotAnEnum command, JsonNode node) { return null; }
    }

    static class SeedShapeTests
    {
        static CloudEvent Input(JsonNode data)
        {
            var e = new CloudEvent { Id = "in-1", Type = "orders", Source = "urn:test", Data = data };
            e["correlationid"] = "corr-7";
            return e;
        }

        static void Json(string expected, JsonNode actual, string what = null)
        {
            Assert.Equal(JsonNode.Parse(expected).ToJsonString(), actual == null ? "null" : actual.ToJsonString(), what);
        }

        static async Task<T> WithGateway<T>(StubGateway stub, Func<Task<T>> run)
        {
            var saved = HostServices.Gateway;
            HostServices.Gateway = stub.Call;
            try
            {
                return await run();
            }
            finally
            {
                HostServices.Gateway = saved;
            }
        }

        [Test]
        static async Task SeedApiWorker()
        {
            var stub = new StubGateway();
            stub.Answers["pricing/quote"] = "{\"price\":4}";
            var output = await WithGateway(stub, () => new Pricer().ProcessAsync(Input(new JsonObject { ["sku"] = "a" })));
            Assert.Equal("order.priced", output.Type);
            Assert.Equal("urn:pricer", output.Source);
            Assert.Equal((object)"corr-7", output["correlationid"]);
            Json("{\"price\":4,\"via\":\"pricing-api:5002\"}", output.Data);
            Assert.SequenceEqual(new[] { "pricing/quote {\"sku\":\"a\"}" }, stub.Calls);
            var e = Assert.Throws<NotSupportedException>(() => new Neither());
            Assert.True(e.Message.Contains("overrides neither ProcessAsync(CloudEvent) nor ProcessAsync(CloudEvent, ApiClient)"), e.Message);
        }

        [Test]
        static async Task SeedCommandWorker()
        {
            var output = await new Greeter().ProcessAsync(Input(new JsonObject { ["command"] = "hello", ["name"] = "Ada" }));
            Assert.Equal("greeting", output.Type);
            Assert.Equal((object)"corr-7", output["correlationid"], "Response propagates the correlation id");
            Json("{\"said\":\"hello\",\"to\":\"Ada\"}", output.Data);
            output = await new Greeter().ProcessAsync(Input(new JsonObject { ["command"] = "bye" }));
            Assert.Equal("greeting.error", output.Type);
            Assert.Equal((object)"corr-7", output["correlationid"], "Error propagates the correlation id");
            Json("{\"error\":\"Unknown command: bye\",\"input_id\":\"in-1\",\"input_type\":\"orders\"}", output.Data);
            output = await new Greeter().ProcessAsync(Input(new JsonObject { ["name"] = "x" }));
            Assert.Equal("Missing 'command' field", output.Data["error"].GetValue<string>());
            output = await new Greeter().ProcessAsync(Input(JsonValue.Create("{not json")));
            Assert.Equal("Failed to parse command JSON", output.Data["error"].GetValue<string>());
        }

        [Test]
        static async Task SeedGenericCommandWorker()
        {
            var output = await new Sockets().ProcessAsync(Input(new JsonObject { ["command"] = "create" }));
            Assert.Equal("sockets.response", output.Type);
            Json("\"created\"", output.Data);
            Assert.Equal("create", CommandWorker<WebSocketManagerCommand>.WireName(WebSocketManagerCommand.create));
            output = await new Sockets().ProcessAsync(Input(new JsonObject { ["command"] = "resize" }));
            Assert.Equal("Unknown command: resize", output.Data["error"].GetValue<string>());
            var e = Assert.Throws<ArgumentException>(() => new BadCommands());
            Assert.Equal("error CS0315: The type 'Seed.Workers.NotAnEnum' cannot be used as type parameter 'T' in the generic type or method " +
                "'Virtufin.Worker.DevKit.CommandWorker<T>'. There is no boxing conversion from 'Seed.Workers.NotAnEnum' to 'System.Enum'.", e.Message);
            Assert.Equal("error CS0315: The type 'Seed.Workers.NotAnEnum' cannot be used as type parameter 'T' in the generic type or method " +
                "'Virtufin.Worker.DevKit.ApiCommandWorker<T>'. There is no boxing conversion from 'Seed.Workers.NotAnEnum' to 'System.Enum'.",
                HostBinding.ConstraintError(typeof(BadCommands)));
            Assert.Null(HostBinding.ConstraintError(typeof(Quotes)), "an enum passes");
        }

        [Test]
        static async Task SeedApiCommandWorkerRepoints()
        {
            var stub = new StubGateway();
            stub.Answers["order-service/create"] = "{\"ok\":true}";
            var worker = new Quotes();
            var output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "create", ["order"] = 7 })));
            Json("{\"target\":\"api.internal:6000\",\"answer\":{\"ok\":true}}", output.Data, "the configured client");
            output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "create", ["order"] = 8, ["api_host"] = "other" })));
            Json("{\"target\":\"other:5002\",\"answer\":{\"ok\":true}}", output.Data, "api_host: re-pointed, default port 5002");
            output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "create", ["order"] = 9, ["api_port"] = 7000 })));
            Json("{\"target\":\"api.internal:7000\",\"answer\":{\"ok\":true}}", output.Data, "api_port alone: the configured host");
            output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "create", ["order"] = 10 })));
            Json("{\"target\":\"api.internal:6000\",\"answer\":{\"ok\":true}}", output.Data, "back to the configured client");
            Assert.SequenceEqual(new[] { "order-service/create 7", "order-service/create 8", "order-service/create 9", "order-service/create 10" }, stub.Calls);
        }

        [Test]
        static async Task SeedNonGenericApiCommandWorker()
        {
            var stub = new StubGateway();
            stub.Answers["directory/find"] = "\"found\"";
            var worker = new Lookup();
            var output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "find", ["who"] = "ada" })));
            Json("{\"target\":\"api.internal:6000\",\"answer\":\"found\"}", output.Data);
            output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "find", ["who"] = "bob", ["api_host"] = "h2" })));
            Json("{\"target\":\"h2:5002\",\"answer\":\"found\"}", output.Data);
            output = await WithGateway(stub, () => worker.ProcessAsync(Input(new JsonObject { ["command"] = "find", ["api_port"] = 0 })));
            Assert.Equal("Invalid 'api_port' field: 0", output.Data["error"].GetValue<string>());
            Assert.SequenceEqual(new[] { "directory/find \"ada\"", "directory/find \"bob\"" }, stub.Calls);
        }

        [Test]
        static async Task SeedDynamicGatewayRequests()
        {
            var stub = new StubGateway();
            stub.Answers["svc/echo"] = "plain text";
            stub.Answers["svc/raw"] = "\u0001";
            var api = new ApiClient(stub.Call);
            dynamic gateway = api.Gateway;
            JsonNode a = await gateway.svc.echo(new Dictionary<string, object> { { "n", 1 }, { "list", new object[] { "x", true, 2.5 } }, { "none", null } });
            Json("\"plain text\"", a, "an answer that is not JSON: a string value");
            JsonNode b = await gateway.svc.echo();
            Json("\"plain text\"", b, "no request: an empty body");
            byte[] c = await gateway.svc.raw(new byte[] { 1, 2 });
            Assert.Equal(1, c.Length);
            await Assert.ThrowsAsync<GatewayException>(async () => { await gateway.svc.missing("x"); });
            Assert.Throws<ArgumentException>(() => { gateway.svc.echo(1, 2); }, "one request");
            Assert.Throws<ArgumentException>(() => { gateway.svc.echo(new object()); }, "an object is not a request");
            Assert.SequenceEqual(new[] { "svc/echo {\"n\":1,\"list\":[\"x\",true,2.5],\"none\":null}", "svc/echo ", "svc/raw \u0001\u0002", "svc/missing \"x\"" }, stub.Calls);
        }
    }
}
