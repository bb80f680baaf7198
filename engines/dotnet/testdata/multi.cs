using System.Collections.Generic;
using System.Threading.Tasks;
using Virtufin.Worker;

public class Multi : IMultiOutputWorker
{
    public Task<IList<CloudEvent>> ProcessAllAsync(CloudEvent input)
    {
        IList<CloudEvent> outs = new List<CloudEvent>
        {
            new CloudEvent { Type = "conformance.a", Data = 1 },
            new CloudEvent { Type = "conformance.b", Data = "two" },
        };
        return Task.FromResult(outs);
    }
}
