package org.hydraedge.demo;

import android.app.Service;
import android.content.Intent;
import android.os.Bundle;
import android.os.Handler;
import android.os.HandlerThread;
import android.os.IBinder;
import android.os.Message;
import android.os.Messenger;
import android.os.RemoteException;

import java.io.File;

/**
 * Runs {@link Probe} in its own process (android:process=":probe" in the manifest), so a program the ExecuTorch
 * runtime aborts or crashes on ends this process, not the app's. One request a message: PROBE with "pte",
 * "inputs" (paths in the app's own storage) and "threads"; the answer: PROBE with "error" unless it ran.
 */
public final class ProbeService extends Service {
    static final int PROBE = 1;
    static final String PTE = "pte";
    static final String INPUTS = "inputs";
    static final String THREADS = "threads";
    static final String ERROR = "error";

    private HandlerThread worker;
    private Messenger messenger;

    @Override
    public void onCreate() {
        super.onCreate();
        worker = new HandlerThread("hydra-edge-probe");
        worker.start();
        messenger = new Messenger(new Handler(worker.getLooper()) {
            @Override
            public void handleMessage(Message request) {
                if (request.what != PROBE || request.replyTo == null) return;
                Bundle asked = request.getData();
                String why = Probe.run(new File(asked.getString(PTE)), new File(asked.getString(INPUTS)),
                        asked.getInt(THREADS, 1));
                Message answer = Message.obtain(null, PROBE);
                Bundle said = new Bundle();
                if (!Probe.OK.equals(why)) said.putString(ERROR, why);
                answer.setData(said);
                try {
                    request.replyTo.send(answer);
                } catch (RemoteException e) {
                    // the app went away while this ran: nobody to tell
                }
            }
        });
    }

    @Override
    public IBinder onBind(Intent intent) {
        return messenger.getBinder();
    }

    @Override
    public void onDestroy() {
        worker.quitSafely();
        super.onDestroy();
    }
}
