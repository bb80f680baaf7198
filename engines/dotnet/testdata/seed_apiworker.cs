// The original DevKit's ApiWorker: constructed with (apiHost, apiPort,
// responseEventType, source), overriding ProcessAsync(CloudEvent, ApiClient),
// calling a backend through the dynamic gateway.
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;

public class OrderPricer : ApiWorker
{
    public OrderPricer() : base("localhost", 5002, "order.priced", "urn:seed:pricer") { }

    public override async Task<CloudEvent> ProcessAsync(CloudEvent input, ApiClient api)
    {
        dynamic gateway = api.Gateway;
        var quote = await gateway.pricing.quote(new JsonObject { ["sku"] = input.Data["sku"].DeepClone() });
        return Response(input, new JsonObject { ["price"] = ((JsonNode)quote)["price"].DeepClone(), ["api"] = api.Target });
    }
}
