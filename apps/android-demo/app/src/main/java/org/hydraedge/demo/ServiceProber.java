package org.hydraedge.demo;

import android.content.ComponentName;
import android.content.Context;
import android.content.Intent;
import android.content.ServiceConnection;
import android.os.Bundle;
import android.os.Handler;
import android.os.HandlerThread;
import android.os.IBinder;
import android.os.Message;
import android.os.Messenger;
import android.os.RemoteException;

import java.io.File;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The phone's {@link Prober}: asks {@link ProbeService}, in its own process, and waits for its answer on the
 * calling (worker) thread. When that process dies while probing (the runtime aborted or crashed on the
 * program), the binder's death says so and the program is refused; the next probe binds a fresh process.
 */
final class ServiceProber implements Prober {
    private static final long CONNECT_S = 20;
    private static final long ANSWER_S = 300;
    /** What the queue holds when the probe's process died, besides its answers (null: it ran; else why not). */
    private static final Object DIED = new Object();
    private static final Object RAN = new Object();

    private final Context context;
    private final HandlerThread replies = new HandlerThread("hydra-edge-probe-replies");
    private final Messenger replyTo;
    private final BlockingQueue<Object> answers = new LinkedBlockingQueue<Object>();
    private final BlockingQueue<Messenger> connected = new LinkedBlockingQueue<Messenger>();
    private ServiceConnection connection;

    ServiceProber(Context context) {
        this.context = context.getApplicationContext();
        replies.start();
        replyTo = new Messenger(new Handler(replies.getLooper()) {
            @Override
            public void handleMessage(Message answer) {
                String error = answer.getData().getString(ProbeService.ERROR);
                answers.add(error == null ? RAN : error);
            }
        });
    }

    @Override
    public String probe(File pte, File inputs, int threads) throws InterruptedException {
        Messenger service = connect();
        if (service == null) return "the probe process did not start within " + CONNECT_S + " s";
        answers.clear();
        Message request = Message.obtain(null, ProbeService.PROBE);
        Bundle asked = new Bundle();
        asked.putString(ProbeService.PTE, pte.getAbsolutePath());
        asked.putString(ProbeService.INPUTS, inputs.getAbsolutePath());
        asked.putInt(ProbeService.THREADS, threads);
        request.setData(asked);
        request.replyTo = replyTo;
        try {
            service.send(request);
        } catch (RemoteException e) {
            answers.add(DIED);
        }
        Object answer = answers.poll(ANSWER_S, TimeUnit.SECONDS);
        if (answer == RAN) return null;
        disconnect();  // a dead or stuck probe process: the next probe starts another
        if (answer == null) return "the ExecuTorch runtime did not answer loading " + pte.getName() + " within " + ANSWER_S + " s";
        if (answer == DIED) return "the ExecuTorch runtime ended its process loading " + pte.getName() + " (a native abort or crash)";
        return (String) answer;
    }

    private Messenger connect() throws InterruptedException {
        Messenger kept = connected.peek();
        if (kept != null && !kept.getBinder().isBinderAlive()) disconnect();  // its process went between probes
        if (connection == null) {
            connected.clear();
            connection = new ServiceConnection() {
                @Override
                public void onServiceConnected(ComponentName name, IBinder binder) {
                    try {
                        binder.linkToDeath(new IBinder.DeathRecipient() {
                            @Override
                            public void binderDied() {
                                answers.add(DIED);
                            }
                        }, 0);
                    } catch (RemoteException e) {
                        answers.add(DIED);  // it died before it could be watched
                    }
                    connected.add(new Messenger(binder));
                }

                @Override
                public void onServiceDisconnected(ComponentName name) {
                    answers.add(DIED);
                }
            };
            if (!context.bindService(new Intent(context, ProbeService.class), connection, Context.BIND_AUTO_CREATE)) {
                connection = null;
                return null;
            }
        }
        Messenger service = connected.poll(CONNECT_S, TimeUnit.SECONDS);
        if (service != null) connected.add(service);  // kept for the next probe while this process lives
        else disconnect();
        return service;
    }

    private void disconnect() {
        if (connection != null) {
            context.unbindService(connection);
            connection = null;
        }
        connected.clear();
    }

    @Override
    public void close() {
        disconnect();
        replies.quitSafely();
    }
}
