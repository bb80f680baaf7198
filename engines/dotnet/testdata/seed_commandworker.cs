// The original DevKit's non-generic CommandWorker: HandleCommandAsync(input,
// command, node), answering with Response(input, ...) or Error(input, ...).
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;

public class Greeter : CommandWorker
{
    public Greeter() : base("greeting", "urn:seed:greeter") { }

    protected override Task<CloudEvent> HandleCommandAsync(CloudEvent input, string command, JsonNode node)
    {
        switch (command)
        {
            case "hello":
                return Task.FromResult(Response(input, new JsonObject { ["greeting"] = "hello, " + (string)node["name"] }));
            default:
                return Task.FromResult(Error(input, "Unknown command: " + command));
        }
    }
}
