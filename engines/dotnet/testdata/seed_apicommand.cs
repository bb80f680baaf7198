// The original DevKit's ApiCommandWorker<T>: the Api property during
// HandleAsync, re-pointed by api_host/api_port (default port 5002), and a
// backend call through the dynamic gateway.
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;

public enum QuoteCommand { quote }

public class QuoteWorker : ApiCommandWorker<QuoteCommand>
{
    public QuoteWorker() : base("api.internal", 6000, "quote.response", "urn:seed:quotes") { }

    protected override async Task<CloudEvent> HandleAsync(CloudEvent input, QuoteCommand command, JsonNode node)
    {
        dynamic gateway = Api.Gateway;
        JsonNode answer = await gateway.pricing.quote(node["symbol"]);
        return Response(input, new JsonObject { ["api"] = Api.Target, ["answer"] = answer });
    }
}
