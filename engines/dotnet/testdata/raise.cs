using System;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Raise : IWorker
{
    public async Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        await Task.Yield();
        if (input.Type == "conformance.raise")
            throw new InvalidOperationException("boom");
        var corr = input["correlationid"];
        return new CloudEvent
        {
            Type = "conformance.echo", DataContentType = "application/json",
            Data = new JsonObject { ["id"] = input.Id, ["data"] = input.Data == null ? null : input.Data.DeepClone(),
                ["correlationid"] = corr == null ? null : (JsonNode)corr.ToString() },
        };
    }
}
