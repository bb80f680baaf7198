using System.Threading;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Hang : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        if (input.Type == "conformance.hang")
            Thread.Sleep(Timeout.Infinite);
        var corr = input["correlationid"];
        return Task.FromResult(new CloudEvent
        {
            Type = "conformance.echo", DataContentType = "application/json",
            Data = new JsonObject { ["id"] = input.Id, ["data"] = input.Data == null ? null : input.Data.DeepClone(),
                ["correlationid"] = corr == null ? null : (JsonNode)corr.ToString() },
        });
    }
}
