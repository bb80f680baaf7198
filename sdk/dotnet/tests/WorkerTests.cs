using System;
using System.Reflection;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Tests
{
    sealed class Totals : WorkerBase
    {
        public Totals(string source = null) : base("orders.totals", source) { }

        public override Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            var items = input.Data["items"].AsArray();
            if (items.Count == 0) return Task.FromResult(Error(input, "no items"));
            decimal total = 0;
            foreach (var item in items) total += item["price"].GetValue<decimal>();
            return Task.FromResult(Response(input, new JsonObject { ["total"] = total }));
        }
    }

    public enum Command { Start, Stop, Crash, CrashAsync, Aggregate, Reflection, Nothing, NullTask }

    sealed class Jobs : CommandWorker<Command>
    {
        public Jobs() : base("jobs.response", "urn:jobs") { }

        protected override async Task<CloudEvent> HandleAsync(CloudEvent input, Command command, JsonNode payload)
        {
            switch (command)
            {
                case Command.Start:
                    return Response(input, new JsonObject { ["started"] = payload["job"].DeepClone(), ["payload"] = payload.DeepClone() });
                case Command.Stop:
                    await Task.Yield();
                    return Response(input, new JsonObject { ["stopped"] = payload["job"].DeepClone() });
                case Command.Crash:
                    throw new InvalidOperationException("boom");
                case Command.CrashAsync:
                    await Task.Yield();
                    throw new FormatException("late boom");
                case Command.Aggregate:
                    throw new AggregateException(new AggregateException(new TimeoutException("slow")));
                case Command.Reflection:
                    throw new TargetInvocationException(new DivideByZeroException("div"));
                case Command.Nothing:
                    return null;
                case Command.NullTask:
                    return null;
                default:
                    throw new ArgumentOutOfRangeException("command", command, "unhandled command");
            }
        }
    }

    sealed class NullTaskJobs : CommandWorker<Command>
    {
        public NullTaskJobs() : base("jobs.response") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Command command, JsonNode payload)
        {
            if (command == Command.NullTask) return null;
            throw new NotSupportedException("sync " + CommandWorker<Command>.WireName(command));
        }
    }

    public enum Light { Red, Yellow, Green }

    /// <summary>Forgets Green: the exhaustiveness test pattern of the README finds it.</summary>
    sealed class Lights : CommandWorker<Light>
    {
        public Lights() : base("lights.response") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Light command, JsonNode payload)
        {
            switch (command)
            {
                case Light.Red: return Task.FromResult(Response(input, "stop"));
                case Light.Yellow: return Task.FromResult(Response(input, "wait"));
                default: throw new ArgumentOutOfRangeException("command", command, "unhandled command");
            }
        }
    }

    sealed class Strict : CommandWorker<Light>
    {
        public Strict() : base("strict.response") { }

        public override Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            if (input.Subject == null) throw new ArgumentException("subject required: fail the event");
            return base.ProcessAsync(input);
        }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Light command, JsonNode payload)
        {
            return Task.FromResult(Response(input, CommandWorker<Light>.WireName(command)));
        }
    }

    sealed class NotAnEnum : CommandWorker<int>
    {
        public NotAnEnum() : base("x") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, int command, JsonNode payload) { return null; }
    }

    public enum Clash { Go, GO }
    public enum Alias { Go, Run = Go }

    sealed class ClashWorker : CommandWorker<Clash>
    {
        public ClashWorker() : base("x") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Clash command, JsonNode payload) { return null; }
    }

    sealed class AliasWorker : CommandWorker<Alias>
    {
        public AliasWorker() : base("alias.response") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Alias command, JsonNode payload)
        {
            return Task.FromResult(Response(input, command.ToString()));
        }
    }

    sealed class BadResponseType : WorkerBase
    {
        public BadResponseType(string type) : base(type) { }

        public override Task<CloudEvent> ProcessAsync(CloudEvent input) { return null; }
    }

    static class WorkerTests
    {
        static CloudEvent Input(JsonNode data, string correlationId = "corr-1")
        {
            var e = new CloudEvent { Id = "in-1", Source = "urn:test", Type = "jobs", DataContentType = "application/json", Data = data };
            if (correlationId != null) e["correlationid"] = correlationId;
            return e;
        }

        static CloudEvent Run(IWorker worker, CloudEvent input)
        {
            return worker.ProcessAsync(input).GetAwaiter().GetResult();
        }

        static void AssertError(CloudEvent output, string type, string message, string inputId = "in-1", string inputType = "jobs")
        {
            Assert.NotNull(output, "an error response");
            Assert.Equal(type, output.Type, "error type");
            Assert.Json(new JsonObject { ["error"] = message, ["input_id"] = inputId, ["input_type"] = inputType }.ToJsonString(), output.Data, "error data");
        }

        [Test]
        static void ResponseCarriesEverything()
        {
            var output = Run(new Totals("urn:totals"), Input(new JsonObject { ["items"] = new JsonArray(new JsonObject { ["price"] = 1.5 }, new JsonObject { ["price"] = 2 }) }));
            Assert.Equal("orders.totals", output.Type);
            Assert.Equal("urn:totals", output.Source);
            Assert.Equal("application/json", output.DataContentType);
            Assert.Equal("1.0", output.SpecVersion);
            Guid id;
            Assert.True(Guid.TryParse(output.Id, out id), "a Guid id: " + output.Id);
            Assert.Json("{\"total\":3.5}", output.Data);
            Assert.Equal((object)"corr-1", output["correlationid"]);
            var other = Run(new Totals("urn:totals"), Input(new JsonObject { ["items"] = new JsonArray(new JsonObject { ["price"] = 1 }) }));
            Assert.True(other.Id != output.Id, "ids differ");
        }

        [Test]
        static void ResponseWithoutSourceOrCorrelation()
        {
            var output = Run(new Totals(), Input(new JsonObject { ["items"] = new JsonArray(new JsonObject { ["price"] = 1 }) }, null));
            Assert.Null(output.Source, "the node fills in the source");
            Assert.Null(output["correlationid"]);
            Assert.Equal(0, output.Extensions.Count);
        }

        [Test]
        static void ErrorResponse()
        {
            var output = Run(new Totals("urn:totals"), Input(new JsonObject { ["items"] = new JsonArray() }));
            AssertError(output, "orders.totals.error", "no items");
            Assert.Equal("urn:totals", output.Source);
            Assert.Equal((object)"corr-1", output["correlationid"]);
            Assert.Equal("{\"error\":\"no items\",\"input_id\":\"in-1\",\"input_type\":\"jobs\"}", output.Data.ToJsonString());
        }

        [Test]
        static void ErrorResponseWithoutInputId()
        {
            var input = new CloudEvent { Data = new JsonObject { ["items"] = new JsonArray() } };
            var output = Run(new Totals(), input);
            Assert.Equal("{\"error\":\"no items\",\"input_id\":null,\"input_type\":null}", output.Data.ToJsonString());
        }

        [Test]
        static void ResponseTypeRequired()
        {
            Assert.Throws<ArgumentException>(() => new BadResponseType(""));
            Assert.Throws<ArgumentException>(() => new BadResponseType(null));
            Assert.Equal("t", new BadResponseType("t").ResponseType);
        }

        [Test]
        static void ThrowingFailsTheEvent()
        {
            Assert.Throws<NullReferenceException>(() => Run(new Totals(), Input(new JsonObject())), "an exception is not an error response");
        }

        [Test]
        static void CommandDispatch()
        {
            var jobs = new Jobs();
            foreach (var name in new[] { "start", "START", "Start", "sTaRt" })
            {
                var output = Run(jobs, Input(new JsonObject { ["command"] = name, ["job"] = 7 }));
                Assert.Equal("jobs.response", output.Type, name);
                Assert.Equal("urn:jobs", output.Source);
                Assert.Equal((object)"corr-1", output["correlationid"]);
                Assert.Json("{\"started\":7,\"payload\":{\"command\":\"" + name + "\",\"job\":7}}", output.Data, "payload is the whole data object");
            }
            var stopped = Run(jobs, Input(new JsonObject { ["command"] = "stop", ["job"] = "j" }));
            Assert.Json("{\"stopped\":\"j\"}", stopped.Data, "async handler");
        }

        [Test]
        static void CommandFromJsonText()
        {
            var input = Input(JsonValue.Create("{\"command\":\"stop\",\"job\":1}"));
            input.DataContentType = "text/plain";
            Assert.Json("{\"stopped\":1}", Run(new Jobs(), input).Data);
            var binary = Input(null);
            binary.DataBase64 = Encoding.UTF8.GetBytes("{\"command\":\"start\",\"job\":2}");
            Assert.Json("{\"started\":2,\"payload\":{\"command\":\"start\",\"job\":2}}", Run(new Jobs(), binary).Data);
        }

        [Test]
        static void CommandParseErrors()
        {
            var cases = new JsonNode[]
            {
                null, new JsonArray(1), JsonValue.Create("not json"), JsonValue.Create("[1,2]"), JsonValue.Create("\"text\""),
                JsonValue.Create(5), JsonValue.Create(true), JsonValue.Create(""), JsonValue.Create("null"),
            };
            foreach (var data in cases)
                AssertError(Run(new Jobs(), Input(data)), "jobs.response.error", "Failed to parse command JSON");
            var badUtf8 = Input(null);
            badUtf8.DataBase64 = new byte[] { 0x7b, 0xff, 0x7d };
            AssertError(Run(new Jobs(), badUtf8), "jobs.response.error", "Failed to parse command JSON");
        }

        [Test]
        static void CommandMissing()
        {
            AssertError(Run(new Jobs(), Input(new JsonObject { ["job"] = 1 })), "jobs.response.error", "Missing 'command' field");
            AssertError(Run(new Jobs(), Input(new JsonObject { ["command"] = null })), "jobs.response.error", "Missing 'command' field");
            AssertError(Run(new Jobs(), Input(JsonValue.Create("{}"))), "jobs.response.error", "Missing 'command' field");
        }

        [Test]
        static void CommandUnknown()
        {
            var cases = new[]
            {
                new[] { "\"jump\"", "Unknown command: jump" },
                new[] { "\"1\"", "Unknown command: 1" },
                new[] { "\"0\"", "Unknown command: 0" },
                new[] { "1", "Unknown command: 1" },
                new[] { "\" start\"", "Unknown command:  start" },
                new[] { "\"start,stop\"", "Unknown command: start,stop" },
                new[] { "\"\"", "Unknown command: " },
                new[] { "true", "Unknown command: true" },
                new[] { "{\"a\":1}", "Unknown command: {\"a\":1}" },
                new[] { "[\"start\"]", "Unknown command: [\"start\"]" },
            };
            foreach (var c in cases)
            {
                var data = new JsonObject { ["command"] = JsonNode.Parse(c[0]) };
                AssertError(Run(new Jobs(), Input(data)), "jobs.response.error", c[1]);
            }
        }

        [Test]
        static void CommandHandlerExceptions()
        {
            var cases = new[]
            {
                new[] { "crash", "Internal error: InvalidOperationException: boom" },
                new[] { "crashasync", "Internal error: FormatException: late boom" },
                new[] { "aggregate", "Internal error: TimeoutException: slow" },
                new[] { "reflection", "Internal error: DivideByZeroException: div" },
            };
            foreach (var c in cases)
            {
                var output = Run(new Jobs(), Input(new JsonObject { ["command"] = c[0] }));
                AssertError(output, "jobs.response.error", c[1]);
                Assert.Equal((object)"corr-1", output["correlationid"]);
                Assert.Equal("urn:jobs", output.Source);
            }
            AssertError(Run(new NullTaskJobs(), Input(new JsonObject { ["command"] = "Start" })), "jobs.response.error",
                "Internal error: NotSupportedException: sync start");
        }

        [Test]
        static void CommandWithoutOutput()
        {
            Assert.Null(Run(new Jobs(), Input(new JsonObject { ["command"] = "nothing" })));
            Assert.Null(Run(new NullTaskJobs(), Input(new JsonObject { ["command"] = "nulltask" })), "a null task is no output");
        }

        [Test]
        static void CommandTypeMustBeAnEnum()
        {
            var e = Assert.Throws<ArgumentException>(() => new NotAnEnum());
            Assert.True(e.Message.StartsWith("error CS0315: The type '", StringComparison.Ordinal) && e.Message.EndsWith("' to 'System.Enum'.", StringComparison.Ordinal), e.Message);
            var clash = Assert.Throws<ArgumentException>(() => new ClashWorker());
            Assert.True(clash.Message.Contains("same wire name"), clash.Message);
            Assert.Json("\"Go\"", Run(new AliasWorker(), Input(new JsonObject { ["command"] = "run" })).Data, "aliases of one value are fine");
        }

        [Test]
        static void WireNames()
        {
            Assert.Equal("crashasync", CommandWorker<Command>.WireName(Command.CrashAsync));
            Assert.Equal("red", CommandWorker<Light>.WireName(Light.Red));
        }

        [Test]
        static void OverriddenProcessCanFailTheEvent()
        {
            Assert.Throws<ArgumentException>(() => Run(new Strict(), Input(new JsonObject { ["command"] = "red" })));
            var input = Input(new JsonObject { ["command"] = "GREEN" });
            input.Subject = "s";
            Assert.Json("\"green\"", Run(new Strict(), input).Data);
            Assert.Throws<ArgumentNullException>(() => Run(new Jobs(), null));
        }

        // The README's exhaustiveness test pattern: every command must reach a
        // case of the handler's switch, not its default.
        static async Task<string[]> Unhandled<T>(IWorker worker) where T : struct
        {
            var missing = new System.Collections.Generic.List<string>();
            foreach (T command in Enum.GetValues(typeof(T)))
            {
                var input = new CloudEvent { Id = "t", Type = "test", Data = new JsonObject { ["command"] = command.ToString() } };
                var output = await worker.ProcessAsync(input);
                if (output != null && output.Type.EndsWith(".error") &&
                    output.Data["error"].GetValue<string>().StartsWith("Internal error: ArgumentOutOfRangeException"))
                    missing.Add(command.ToString());
            }
            return missing.ToArray();
        }

        [Test]
        static async Task ExhaustivenessPattern()
        {
            Assert.SequenceEqual(new string[0], await Unhandled<Command>(new Jobs()), "Jobs handles every command");
            Assert.SequenceEqual(new[] { "Green" }, await Unhandled<Light>(new Lights()), "Lights forgets Green");
        }
    }
}
