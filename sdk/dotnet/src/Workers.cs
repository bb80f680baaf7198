using System.Collections.Generic;
using System.Threading.Tasks;

namespace Virtufin.Worker
{
    /// <summary>
    /// A worker: the WorkManager host creates one instance of the (public,
    /// parameterless-constructible) class and calls it with each input event.
    /// </summary>
    public interface IWorker
    {
        /// <summary>
        /// Handles one event: returns the output event, or null for none. Throwing
        /// fails the event (the node retries it and finally dead-letters it).
        /// </summary>
        Task<CloudEvent> ProcessAsync(CloudEvent input);
    }

    /// <summary>A worker returning any number of outputs; the host prefers it over <see cref="IWorker"/>.</summary>
    public interface IMultiOutputWorker
    {
        /// <summary>
        /// Handles one event: returns the output events in order (null or empty
        /// for none). Throwing fails the event.
        /// </summary>
        Task<IList<CloudEvent>> ProcessAllAsync(CloudEvent input);
    }
}
