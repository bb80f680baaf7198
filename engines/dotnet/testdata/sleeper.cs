using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

// Waits 30 ms per event (a slow backend) and says when it ran and where.
public class Sleeper : IWorker
{
    static double Now() { return (DateTime.UtcNow - new DateTime(1970, 1, 1)).TotalSeconds; }

    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var enter = Now();
        Thread.Sleep(30);
        var data = new JsonObject
        {
            ["enter"] = enter,
            ["exit"] = Now(),
            ["pid"] = Process.GetCurrentProcess().Id,
        };
        return Task.FromResult(new CloudEvent { Type = "slow.done", DataContentType = "application/json", Data = data });
    }
}
