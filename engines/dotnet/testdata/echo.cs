using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Echo : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var corr = input["correlationid"];
        var data = new JsonObject
        {
            ["id"] = input.Id,
            ["data"] = input.Data == null ? null : input.Data.DeepClone(),
            ["correlationid"] = corr == null ? null : (JsonNode)corr.ToString(),
        };
        return Task.FromResult(new CloudEvent { Type = "conformance.echo", DataContentType = "application/json", Data = data });
    }
}
