using System.Threading.Tasks;
using Virtufin.Worker;

public class None : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input) { return Task.FromResult<CloudEvent>(null); }
}
